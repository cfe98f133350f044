//! [`PeerClock`], the I/O-free part of peer liveness: it turns this rank's
//! readings of its peers' counters into a [`Verdict`] (every peer alive, a
//! peer silent, or the store silent).

use std::time::{Duration, Instant};

use super::marks::LEFT;

/// What the readings say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Every peer beat within the timeout, and the store answers.
    Alive,
    /// `peer` (a group rank) has not beaten for `silent_for`.
    PeerSilent { peer: usize, silent_for: Duration },
    /// The store has not answered for `silent_for`; `cause` is its last
    /// error.
    StoreSilent { silent_for: Duration, cause: String },
}

#[derive(Clone, Copy, Debug)]
struct Beat {
    /// The counter as last read (`None` before the first reading); at or
    /// above [`LEFT`] once the peer left.
    value: Option<i64>,
    /// When the reading last found it changed (or the clock started).
    changed: Instant,
}

/// The liveness of a group's peers from this rank's readings of their
/// beats: no I/O and no clock of its own (every call passes `now`).
#[derive(Debug)]
pub(crate) struct PeerClock {
    me: usize,
    timeout: Duration,
    beats: Vec<Beat>,
    /// When the store last answered.
    store_ok: Instant,
    store_error: Option<String>,
}

impl PeerClock {
    /// A clock for rank `me` of a group of `size`, started at `now` (every
    /// peer counts as just heard from).
    pub(crate) fn new(me: usize, size: usize, timeout: Duration, now: Instant) -> PeerClock {
        PeerClock {
            me,
            timeout,
            beats: vec![
                Beat {
                    value: None,
                    changed: now,
                };
                size
            ],
            store_ok: now,
            store_error: None,
        }
    }

    /// The peers whose counters a reading asks for, in order.
    pub(crate) fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.beats.len()).filter(move |&r| r != self.me)
    }

    /// A reading at `now`: `values[i]` is the counter of the `i`-th of
    /// [`peers`](Self::peers) (`None`: not readable).
    pub(crate) fn read(&mut self, values: &[Option<i64>], now: Instant) {
        self.store_ok = now;
        self.store_error = None;
        let peers: Vec<usize> = self.peers().collect();
        for (&peer, &v) in peers.iter().zip(values) {
            let b = &mut self.beats[peer];
            if v.is_some() && v != b.value {
                b.value = v;
                b.changed = now;
            }
        }
    }

    /// The store failed to answer at `now` with `cause`.
    pub(crate) fn store_failed(&mut self, cause: String) {
        self.store_error = Some(cause);
    }

    /// The verdict at `now`: the store's silence first (it makes every
    /// peer look silent), then the peer silent longest.
    pub(crate) fn verdict(&self, now: Instant) -> Verdict {
        let store_silent = now.saturating_duration_since(self.store_ok);
        if store_silent >= self.timeout {
            return Verdict::StoreSilent {
                silent_for: store_silent,
                cause: self
                    .store_error
                    .clone()
                    .unwrap_or_else(|| "no answer".into()),
            };
        }
        self.peers()
            .filter(|&p| self.beats[p].value.is_none_or(|v| v < LEFT))
            .map(|p| (p, now.saturating_duration_since(self.beats[p].changed)))
            .filter(|&(_, d)| d >= self.timeout)
            .max_by_key(|&(_, d)| d)
            .map_or(Verdict::Alive, |(peer, silent_for)| Verdict::PeerSilent {
                peer,
                silent_for,
            })
    }
}
