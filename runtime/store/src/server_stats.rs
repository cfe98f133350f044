//! What a [`TcpStoreServer`](crate::TcpStoreServer) has served: requests,
//! bytes and the time spent answering them, so the load that ranks put on
//! the store can be measured.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A snapshot of what a server served since it started
/// ([`TcpStoreServer::stats`](crate::TcpStoreServer::stats)). Subtract two
/// snapshots for the load of an interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections accepted.
    pub connections: u64,
    /// Requests answered or queued (a waiting one counts once, when it
    /// arrives).
    pub requests: u64,
    /// Bytes of request frames read.
    pub bytes_in: u64,
    /// Bytes of reply frames written (the replies to waiting requests
    /// included).
    pub bytes_out: u64,
    /// Time spent decoding, executing and encoding requests, on all of the
    /// server's threads together (socket reads and writes not included).
    pub busy: Duration,
}

impl ServerStats {
    /// What was served between `earlier` and this snapshot.
    pub fn since(&self, earlier: &ServerStats) -> ServerStats {
        ServerStats {
            connections: self.connections.saturating_sub(earlier.connections),
            requests: self.requests.saturating_sub(earlier.requests),
            bytes_in: self.bytes_in.saturating_sub(earlier.bytes_in),
            bytes_out: self.bytes_out.saturating_sub(earlier.bytes_out),
            busy: self.busy.saturating_sub(earlier.busy),
        }
    }
}

/// The server's counters, shared by its connections.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    connections: AtomicU64,
    requests: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    busy_ns: AtomicU64,
}

impl Counters {
    pub(crate) fn connected(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    /// `requests` frames of `bytes_in` bytes answered with `bytes_out`
    /// bytes of replies in `busy`.
    pub(crate) fn served(&self, requests: u64, bytes_in: u64, bytes_out: u64, busy: Duration) {
        if requests > 0 {
            self.requests.fetch_add(requests, Ordering::Relaxed);
            self.bytes_in.fetch_add(bytes_in, Ordering::Relaxed);
        }
        self.bytes_out.fetch_add(bytes_out, Ordering::Relaxed);
        let ns = u64::try_from(busy.as_nanos()).unwrap_or(u64::MAX);
        self.busy_ns.fetch_add(ns, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> ServerStats {
        ServerStats {
            connections: self.connections.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            busy: Duration::from_nanos(self.busy_ns.load(Ordering::Relaxed)),
        }
    }
}
