//! Naming the peer a backend lost without saying which: NCCL reports a
//! dead peer as `ncclRemoteError` ("Connection closed by remote peer") or
//! a socket error on the communicator, never its rank. The group's beats
//! in the store do know: the peer whose beat stopped, or that marked itself
//! as left.
//!
//! The backend's asynchronous-error check hands such an error to the
//! group's [`PeerWitness`] and holds it back; the liveness task then
//! watches every peer's counter for a few periods ([`Search`]) and fails
//! the group with `PeerLost` naming the peer that stopped, or, when every
//! peer still beats, lets the check report the backend's error as it is.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::marks::{LEFT, LOST};
use chorus_core::sync::lock;

/// Periods of beats after which a search judges when every other peer's
/// counter has moved meanwhile (a live peer beats once per period).
const EARLY_PERIODS: u32 = 2;

/// Periods of beats after which a search judges anyway: every live peer's
/// counter has moved at least twice.
const LATE_PERIODS: u32 = 3;

/// What the group's witness knows of a peer failure the backend reported.
#[derive(Debug)]
enum State {
    /// Nothing reported.
    Idle,
    /// The backend reported `cause` at `at`; the liveness task is looking
    /// for the peer.
    Asked { cause: String, at: Instant },
    /// The search found every peer alive: the backend's error stands as
    /// it is.
    Cleared,
}

/// Shared by a group's backend check (which reports) and its liveness
/// task (which searches).
#[derive(Debug)]
pub(crate) struct PeerWitness {
    state: Mutex<State>,
    /// How long the check holds an error back when the search never ends
    /// (the liveness task stopped): the liveness timeout.
    hold: Duration,
}

/// What the check does with a peer-side error it reported.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Report {
    /// Hold it back: the search for the peer is under way.
    Hold,
    /// Report it as it is.
    Release,
}

impl PeerWitness {
    /// A witness whose check holds errors back for at most `hold`.
    pub(crate) fn new(hold: Duration) -> PeerWitness {
        PeerWitness {
            state: Mutex::new(State::Idle),
            hold,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// The backend found a peer-side failure that names no peer (`cause`)
    /// at `now`.
    pub(crate) fn report(&self, cause: &str, now: Instant) -> Report {
        let mut st = self.lock();
        match &*st {
            State::Idle => {
                *st = State::Asked {
                    cause: cause.to_string(),
                    at: now,
                };
                Report::Hold
            }
            State::Asked { at, .. } if now.saturating_duration_since(*at) < self.hold => {
                Report::Hold
            }
            State::Asked { .. } | State::Cleared => Report::Release,
        }
    }

    /// The failure the liveness task should look into: the backend's
    /// words and when it reported them.
    pub(crate) fn asked(&self) -> Option<(String, Instant)> {
        match &*self.lock() {
            State::Asked { cause, at } => Some((cause.clone(), *at)),
            _ => None,
        }
    }

    /// The search found every peer alive.
    pub(crate) fn clear(&self) {
        *self.lock() = State::Cleared;
    }
}

/// Why a peer counts as lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Gone {
    /// Its counter has not moved for the search's window.
    Stopped,
    /// It marked itself as left.
    Left,
    /// Another rank's search found it lost and marked it so.
    Marked,
}

impl Gone {
    /// What a counter at `v` says of its peer: marked lost by another
    /// rank, left, or neither.
    pub(crate) fn of(v: i64) -> Option<Gone> {
        if v >= LOST {
            Some(Gone::Marked)
        } else if v >= LEFT {
            Some(Gone::Left)
        } else {
            None
        }
    }
}

/// What a search has found so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Not enough readings yet.
    Looking,
    /// These peers (indices into the reading) are gone, each with why.
    Lost(Vec<(usize, Gone)>),
    /// Every peer's counter moved: nobody is lost.
    NoneLost,
}

/// One search for the peers that stopped beating after a failure at
/// `since`: no I/O and no clock of its own.
#[derive(Debug)]
pub(crate) struct Search {
    since: Instant,
    period: Duration,
    /// The first reading at or after `since`: when, and the counters.
    baseline: Option<(Instant, Vec<Option<i64>>)>,
    /// Per peer: its counter moved since the baseline.
    moved: Vec<bool>,
    /// Per peer: it left, or another rank marked it lost.
    gone: Vec<Option<Gone>>,
    /// Readings after the baseline.
    readings: u32,
}

impl Search {
    /// A search for a failure reported at `since`, over readings of
    /// `peers` counters beaten every `period`.
    pub(crate) fn new(since: Instant, period: Duration, peers: usize) -> Search {
        Search {
            since,
            period,
            baseline: None,
            moved: vec![false; peers],
            gone: vec![None; peers],
            readings: 0,
        }
    }

    /// A reading of every peer's counter at `now` (`None`: unreadable).
    pub(crate) fn read(&mut self, values: &[Option<i64>], now: Instant) {
        for (i, v) in values.iter().enumerate() {
            if let (Some(g), Some(slot)) = (v.and_then(Gone::of), self.gone.get_mut(i)) {
                *slot = Some(g);
            }
        }
        if now < self.since {
            return;
        }
        match &self.baseline {
            None => self.baseline = Some((now, values.to_vec())),
            Some((_, base)) => {
                self.readings += 1;
                for (i, (v, b)) in values.iter().zip(base).enumerate() {
                    if v.is_some() && v != b {
                        if let Some(m) = self.moved.get_mut(i) {
                            *m = true;
                        }
                    }
                }
            }
        }
    }

    /// The verdict at `now`: a peer that left or was marked lost is lost
    /// at once; over at least two readings after the baseline, a peer
    /// whose counter did not move is lost once every other peer's moved
    /// and two periods passed, or once three periods passed whatever the
    /// others did; if every peer moved, nobody is.
    pub(crate) fn outcome(&self, now: Instant) -> Outcome {
        let gone: Vec<(usize, Gone)> = (0..self.gone.len())
            .filter_map(|i| self.gone[i].map(|g| (i, g)))
            .collect();
        if !gone.is_empty() {
            return Outcome::Lost(gone);
        }
        if self.moved.iter().all(|&m| m) {
            return Outcome::NoneLost;
        }
        let Some((t1, _)) = &self.baseline else {
            return Outcome::Looking;
        };
        let since = now.saturating_duration_since(*t1);
        let still: Vec<usize> = (0..self.moved.len()).filter(|&i| !self.moved[i]).collect();
        // Every peer but the still ones moved: a live peer would have too.
        let early = since >= self.period * EARLY_PERIODS;
        let late = since >= self.period * LATE_PERIODS;
        if self.readings < 2 || !(late || early && still.len() < self.moved.len()) {
            return Outcome::Looking;
        }
        Outcome::Lost(still.into_iter().map(|i| (i, Gone::Stopped)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn the_peer_whose_counter_stopped_is_named_after_the_window() {
        let t0 = Instant::now();
        let mut s = Search::new(at(t0, 50), Duration::from_millis(300), 3);
        // Before the failure: not the baseline.
        s.read(&[Some(1), Some(1), Some(1)], t0);
        assert_eq!(s.outcome(t0), Outcome::Looking);
        // Peer 1 died before the failure; 0 and 2 beat every 300 ms. The
        // baseline is the reading at 300 ms.
        for k in 1..=2u64 {
            let v = Some(1 + k as i64);
            s.read(&[v, Some(1), v], at(t0, k * 300));
            assert_eq!(s.outcome(at(t0, k * 300)), Outcome::Looking, "reading {k}");
        }
        // Two readings after the baseline, but not two periods yet.
        s.read(&[Some(4), Some(1), Some(4)], at(t0, 850));
        assert_eq!(s.outcome(at(t0, 850)), Outcome::Looking);
        // Two periods after the baseline, every other peer moved.
        assert_eq!(
            s.outcome(at(t0, 900)),
            Outcome::Lost(vec![(1, Gone::Stopped)])
        );
    }

    #[test]
    fn a_peer_that_left_or_was_marked_lost_is_lost_at_once() {
        let t0 = Instant::now();
        let mut s = Search::new(t0, Duration::from_secs(1), 3);
        s.read(&[Some(7), Some(LEFT + 9), Some(LOST + 3)], t0);
        assert_eq!(
            s.outcome(t0),
            Outcome::Lost(vec![(1, Gone::Left), (2, Gone::Marked)])
        );
    }

    #[test]
    fn a_peer_among_others_that_do_not_move_is_judged_after_three_periods() {
        let t0 = Instant::now();
        let mut s = Search::new(t0, Duration::from_millis(100), 2);
        s.read(&[Some(1), Some(1)], t0);
        s.read(&[Some(1), Some(1)], at(t0, 100));
        s.read(&[Some(1), Some(1)], at(t0, 200));
        // Nobody moved: no way to tell yet whether the store or the peers
        // are slow.
        assert_eq!(s.outcome(at(t0, 250)), Outcome::Looking);
        s.read(&[Some(1), Some(1)], at(t0, 300));
        assert_eq!(
            s.outcome(at(t0, 300)),
            Outcome::Lost(vec![(0, Gone::Stopped), (1, Gone::Stopped)])
        );
    }

    #[test]
    fn nobody_is_lost_when_every_counter_moves() {
        let t0 = Instant::now();
        let mut s = Search::new(t0, Duration::from_secs(1), 2);
        s.read(&[Some(1), Some(1)], t0);
        s.read(&[Some(2), Some(1)], at(t0, 100));
        assert_eq!(s.outcome(at(t0, 100)), Outcome::Looking);
        s.read(&[Some(2), Some(2)], at(t0, 200));
        assert_eq!(s.outcome(at(t0, 200)), Outcome::NoneLost);
    }

    #[test]
    fn unreadable_counters_never_count_as_moves() {
        let t0 = Instant::now();
        let mut s = Search::new(t0, Duration::from_millis(100), 2);
        s.read(&[Some(1), Some(1)], t0);
        for k in 1..=4u64 {
            s.read(&[Some(1 + k as i64), None], at(t0, k * 100));
        }
        assert_eq!(
            s.outcome(at(t0, 400)),
            Outcome::Lost(vec![(1, Gone::Stopped)])
        );
    }

    #[test]
    fn the_check_holds_a_report_until_cleared_or_too_long() {
        let t0 = Instant::now();
        let w = PeerWitness::new(Duration::from_secs(2));
        assert_eq!(w.asked(), None);
        assert_eq!(w.report("remote error", t0), Report::Hold);
        assert_eq!(w.report("remote error", at(t0, 1_000)), Report::Hold);
        assert_eq!(w.asked().map(|(c, _)| c), Some("remote error".into()));
        assert_eq!(w.report("remote error", at(t0, 2_000)), Report::Release);
        let w = PeerWitness::new(Duration::from_secs(2));
        assert_eq!(w.report("x", t0), Report::Hold);
        w.clear();
        assert_eq!(w.asked(), None);
        assert_eq!(w.report("x", at(t0, 10)), Report::Release);
    }
}
