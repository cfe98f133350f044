//! What the TCP backend's handle, its worker and its reader tasks share:
//! the group's failure, each peer's connection state, the receive pool.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chorus_core::relay::Relay;
use chorus_core::{OpContext, WorkError};
use tokio::sync::watch;

use super::options::TcpOptions;
use super::pool::Pool;

/// How a peer's connection ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum PeerState {
    /// Connected.
    Open,
    /// The peer said goodbye: its backend was dropped after finishing its
    /// ops. Frames already received can still be used.
    Departed,
    /// The connection broke (EOF without goodbye, reset, corrupt stream).
    Lost(String),
    /// The link went silent for the liveness timeout (the kernel gave up
    /// on it: `ETIMEDOUT`).
    Silent(Duration),
}

impl PeerState {
    /// How the connection to `peer` ended, as the error of the op `ctx`
    /// that needed it.
    pub(super) fn error(&self, ctx: &OpContext, peer: usize) -> WorkError {
        let cause = match self {
            PeerState::Silent(after) => {
                return WorkError::PeerSilent {
                    ctx: ctx.clone(),
                    peer,
                    after: *after,
                }
            }
            // A goodbye: the peer left, it did not die.
            PeerState::Departed => {
                return WorkError::PeerLeft {
                    ctx: ctx.clone(),
                    peer,
                }
            }
            PeerState::Lost(c) => c.clone(),
            PeerState::Open => "the connection's queue closed".to_string(),
        };
        WorkError::PeerLost {
            ctx: ctx.clone(),
            peer,
            cause,
        }
    }
}

/// State shared by the backend handle, its worker and its reader tasks.
pub(super) struct Inner {
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) group: Arc<str>,
    pub(super) group_hash: u32,
    pub(super) opts: TcpOptions,
    pub(super) pool: Arc<Pool>,
    /// The first failure; later ops fail with it.
    pub(super) failed: Mutex<Option<WorkError>>,
    pub(super) has_failed: AtomicBool,
    /// Set to true on failure or abort: stops the worker's current op.
    pub(super) stop: watch::Sender<bool>,
    /// The first peer whose connection broke, and why. Frames that already
    /// arrived from it are still used (a rank that lags behind finishes the
    /// ops its peers completed before one of them failed, and a mismatch
    /// found in a received header is reported as such, not as the close
    /// that followed it); an op that needs more from it fails at once.
    pub(super) lost: Mutex<Option<(usize, PeerState)>>,
    pub(super) peers: Mutex<Vec<PeerState>>,
    /// Each peer's reader (ended by `stop_readers`).
    pub(super) readers: Mutex<Vec<Arc<Relay>>>,
    /// The worker waits for its next op (set while its queue is empty).
    pub(super) idle: AtomicBool,
    /// Frames sent through shared memory.
    pub(super) shm_frames: AtomicU64,
    /// Frames that could have gone through shared memory but found every
    /// slot in use (sent through the socket).
    pub(super) shm_full: AtomicU64,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpBackend")
            .field("group", &self.group)
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("failed", &self.has_failed.load(Ordering::Relaxed))
            .finish()
    }
}

impl Inner {
    /// Context for failures that belong to no particular op (a peer lost
    /// between ops); re-addressed with `for_op` when an op fails with it.
    pub(super) fn base_ctx(&self) -> OpContext {
        OpContext {
            rank: self.rank,
            group: self.group.clone(),
            seq: 0,
            op: "tcp",
        }
    }

    pub(super) fn failure(&self) -> Option<WorkError> {
        if !self.has_failed.load(Ordering::Acquire) {
            return None;
        }
        self.failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Marks the backend failed with `cause` (the first cause wins) and stops
    /// the worker's current op.
    pub(super) fn fail(&self, cause: &WorkError) {
        {
            let mut f = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
            if f.is_none() {
                tracing::debug!(group = %self.group, rank = self.rank, error = %cause, "TCP backend failed");
                *f = Some(cause.clone());
            }
            self.has_failed.store(true, Ordering::Release);
        }
        self.stop.send_replace(true);
    }

    /// True while some peer's connection is open (no goodbye, not lost).
    pub(super) fn any_peer_open(&self) -> bool {
        let peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        peers
            .iter()
            .enumerate()
            .any(|(p, st)| p != self.rank && *st == PeerState::Open)
    }

    /// Called by a reader task when its connection ends.
    pub(super) fn peer_ended(&self, peer: usize, end: PeerState) {
        {
            let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(p) = peers.get_mut(peer) {
                if *p == PeerState::Open {
                    *p = end.clone();
                }
            }
        }
        // The worker is not stopped here: frames this peer sent before its
        // connection ended are still queued and may be all the op in flight
        // needs (a peer that finished the op and exited). An op that needs
        // more from this peer finds its queue closed and fails at once with
        // `PeerLost`; ops that need nothing more from it may finish.
        if matches!(end, PeerState::Lost(_) | PeerState::Silent(_)) {
            self.lost
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get_or_insert((peer, end));
        }
    }

    /// The group's failure once the worker was stopped: the recorded
    /// failure, else the lost peer (which becomes the failure).
    pub(super) fn settle(&self) -> WorkError {
        if let Some(f) = self.failure() {
            return f;
        }
        let lost = self
            .lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let e = match lost {
            Some((peer, end)) => end.error(&self.base_ctx(), peer),
            None => WorkError::Aborted {
                ctx: self.base_ctx(),
                reason: "the TCP backend was stopped".into(),
            },
        };
        self.fail(&e);
        self.failure().unwrap_or(e)
    }

    pub(super) fn peer_state(&self, peer: usize) -> PeerState {
        self.peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(peer)
            .cloned()
            .unwrap_or(PeerState::Open)
    }

    /// The error for an op that needs `peer` after its connection ended:
    /// the group's failure if it has one (a failed or aborted group ends
    /// its readers itself, and the cause is the failure, not the close),
    /// else how the connection ended.
    pub(super) fn lost_error(&self, ctx: &OpContext, peer: usize) -> WorkError {
        match self.failure() {
            Some(cause) => cause.for_op(ctx.clone()),
            None => self.peer_state(peer).error(ctx, peer),
        }
    }

    pub(super) fn stop_readers(&self) {
        let readers =
            std::mem::take(&mut *self.readers.lock().unwrap_or_else(PoisonError::into_inner));
        for r in readers {
            r.cancel();
        }
    }
}
