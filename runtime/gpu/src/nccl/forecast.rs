//! When an op is expected to end, learned from the ops like it that ended
//! before (docs/ARCHITECTURE.md, "Waking on time").
//!
//! A thread parked for a millisecond or more takes tens to hundreds of
//! microseconds to run again once woken, whatever wakes it: the driver's
//! blocking sync, a host function, a futex (benches/RESULTS.md). Only a
//! thread already awake when the GPU finishes sees it within a few
//! microseconds. So the reactor wakes an awaited op's future shortly
//! *before* the op is expected to end, and the woken future watches the
//! end event itself until it completes.
//!
//! The expectation comes from history: ops of one kind and size on one
//! communicator stream (a gradient bucket's all_reduce, step after step)
//! take about as long from submission to end; so do the launches of a
//! group of ops (a batch) of one shape. The table keeps, per such
//! key, a moving average of that time and of its deviation; an op's
//! expected end is its submission plus the average minus twice the
//! deviation (early rather than late: an early wake costs a little
//! watching, a late one the whole wake-up latency). Without history, or
//! when ops of the key did not end alike (their length follows the work
//! queued before them), there is no expectation: the op's driver waiter
//! wakes its future when the driver sees the end, and a pre-wake would
//! only buy a watch that gives up before the op ends.
//!
//! An op found already done tells only that it ended no later than then.
//! Such a bound is learned when it lies before the average, and only then:
//! it cannot move the expectation past the true end, and it is what pulls
//! the expectation back when ops of a kind get shorter. (Otherwise a
//! too-late expectation would keep itself: the woken future would always
//! find the op done, which alone teaches nothing.)

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use chorus_core::sync::lock;
use chorus_core::Op;

/// What makes ops comparable: where they run, what they do, how much.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    /// The communicator's stream (ops on one stream end in order).
    pub(crate) queue: u64,
    /// The op (a batch's first).
    pub(crate) op: Op,
    /// Bytes of the op's first buffer (a batch's: the sum over its ops).
    pub(crate) bytes: u64,
    /// Ops launched as one: 1 for a lone op, a batch's length.
    pub(crate) ops: u32,
}

/// An op in flight, for the table: its key and when it was submitted.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Forecast {
    pub(crate) key: Key,
    pub(crate) submitted: Instant,
    /// A query found the op still running: a later query that finds it
    /// done sees its end closely enough to learn from (one that finds it
    /// done at once only bounds the end from above).
    pub(crate) seen_running: bool,
}

#[derive(Clone, Copy, Debug)]
struct Stat {
    /// Moving average of submission-to-end, ns.
    mean: f64,
    /// Moving average of the absolute deviation from it, ns.
    dev: f64,
    seen: u32,
}

/// Weight of a new observation in the moving averages.
const ALPHA: f64 = 0.25;
/// Observations needed before an expectation is given.
const MIN_SEEN: u32 = 2;
/// Keys kept; past this the table starts over (a program with unbounded
/// distinct op sizes gains nothing from it).
const MAX_KEYS: usize = 4096;

/// How long, from `now`, a future watches an op due to end soon (its
/// pre-wake's window, see `Watched::prewake_watch`), the op submitted and
/// expected to end at the two instants of `expected`: `tail` (the
/// configured lead) twice over and an eighth of the op's expected length,
/// or until `tail` and that eighth past its expected end if that is
/// later; `tail` twice over without an expected end.
///
/// With the configured lead in force, a future woken on time watches
/// until `tail` and the eighth past the expected end either way. A lead
/// grown for late wake-ups (`crate::lead`) moves the watch's start, not
/// its end.
pub(crate) fn window(
    expected: Option<(Instant, Instant)>,
    now: Instant,
    tail: Duration,
) -> Duration {
    let Some((submitted, end)) = expected else {
        return tail * 2;
    };
    let eighth = end.saturating_duration_since(submitted) / 8;
    (end + tail + eighth)
        .saturating_duration_since(now)
        .max(tail * 2 + eighth)
}

/// Whether ops of a key ended alike enough to expect the next one's end:
/// seen twice, and twice their deviation within `lead` (the configured
/// pre-wake lead) and an eighth of their average length, which a woken
/// future's watch covers past the expected end. Ops whose length varies
/// more (the work queued before them changes from step to step) get no
/// expectation: their driver waiter wakes their future when they end, and
/// a pre-wake would only buy a watch that gives up before the op ends.
fn trusted(s: &Stat, lead: Duration) -> bool {
    s.seen >= MIN_SEEN && 2.0 * s.dev <= lead.as_nanos() as f64 + s.mean / 8.0
}

fn table() -> &'static Mutex<HashMap<Key, Stat>> {
    static T: OnceLock<Mutex<HashMap<Key, Stat>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Forecast {
    /// When the op is expected to end, if ops like it ended alike before
    /// (see [`trusted`]).
    pub(crate) fn expected_end(&self) -> Option<Instant> {
        let lead = crate::reactor::global().config().prewake_lead;
        let t = lock(table());
        let s = t.get(&self.key)?;
        if !trusted(s, lead) {
            return None;
        }
        let ns = (s.mean - 2.0 * s.dev).max(0.0);
        Some(self.submitted + Duration::from_nanos(ns as u64))
    }

    /// The op ended at (or, for an observation that was not watching
    /// closely, no earlier than) `end`.
    pub(crate) fn observe(&self, end: Instant) {
        let ns = end.saturating_duration_since(self.submitted).as_nanos() as f64;
        let mut t = lock(table());
        Self::learn(&mut t, self.key, ns);
    }

    /// The op was found done at `end`: it ended no later than that. Learned
    /// only if that is earlier than ops like it took on average (see the
    /// module docs).
    pub(crate) fn observe_by(&self, end: Instant) {
        let ns = end.saturating_duration_since(self.submitted).as_nanos() as f64;
        let mut t = lock(table());
        if t.get(&self.key).is_some_and(|s| ns < s.mean) {
            Self::learn(&mut t, self.key, ns);
        }
    }

    fn learn(t: &mut HashMap<Key, Stat>, key: Key, ns: f64) {
        if t.len() >= MAX_KEYS && !t.contains_key(&key) {
            t.clear();
        }
        let s = t.entry(key).or_insert(Stat {
            mean: ns,
            dev: 0.0,
            seen: 0,
        });
        let err = ns - s.mean;
        s.mean += ALPHA * err;
        s.dev += ALPHA * (err.abs() - s.dev);
        s.seen = s.seen.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(f: &Forecast, us: u64) -> Instant {
        f.submitted + Duration::from_micros(us)
    }

    fn forecast(bytes: u64) -> Forecast {
        Forecast {
            key: Key {
                queue: 7,
                op: Op::AllReduce(chorus_core::ReduceOp::Sum),
                bytes,
                ops: 1,
            },
            submitted: Instant::now(),
            seen_running: false,
        }
    }

    #[test]
    fn the_watch_window_is_twice_the_tail_or_until_the_tail_past_the_expected_end() {
        let us = Duration::from_micros;
        let f = forecast(1002);
        let now = f.submitted;
        assert_eq!(window(None, now, us(500)), us(1000), "no history");
        // Expected 8 ms after submission: woken on time at 7.5 ms, watched
        // until 8.5 ms and an eighth (1 ms) more.
        let expected = Some((f.submitted, at(&f, 8000)));
        assert_eq!(window(expected, at(&f, 7500), us(500)), us(2000));
        // Earlier (a lead grown to 2 ms): no later.
        assert_eq!(window(expected, at(&f, 6000), us(500)), us(3500));
        // Later (a late wake-up, or a first poll of an op due soon): twice
        // the tail and the eighth.
        assert_eq!(window(expected, at(&f, 7900), us(500)), us(2000));
        assert_eq!(window(expected, at(&f, 9600), us(500)), us(2000));
    }

    #[test]
    fn no_expectation_without_history_then_the_learned_length() {
        let f = forecast(1001);
        assert_eq!(f.expected_end(), None);
        f.observe(at(&f, 3000));
        assert_eq!(f.expected_end(), None, "one observation is not history");
        f.observe(at(&f, 3000));
        let e = f.expected_end().unwrap();
        let ahead = e.duration_since(f.submitted);
        assert!(
            ahead <= Duration::from_micros(3000) && ahead > Duration::from_micros(2000),
            "{ahead:?}"
        );
    }

    #[test]
    fn jittery_lengths_expect_an_earlier_end() {
        let steady = forecast(2002);
        let jittery = forecast(3003);
        for i in 0..20 {
            steady.observe(at(&steady, 5000));
            jittery.observe(at(&jittery, if i % 2 == 0 { 4800 } else { 5200 }));
        }
        let s = steady
            .expected_end()
            .unwrap()
            .duration_since(steady.submitted);
        let j = jittery
            .expected_end()
            .unwrap()
            .duration_since(jittery.submitted);
        assert!(
            j < s,
            "jitter should move the expectation earlier: {j:?} vs {s:?}"
        );
        assert!(s > Duration::from_micros(4900), "{s:?}");
    }

    #[test]
    fn lengths_that_vary_widely_give_no_expectation_until_they_settle() {
        let f = forecast(8008);
        // Lengths drawn across 0.1-30 ms: never one expectation.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..200 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            f.observe(at(&f, 100 + x % 29_900));
            assert_eq!(f.expected_end(), None);
        }
        // Rising steps: each new length is not expected until ops of it
        // ended alike a few times, then it is, early.
        for len in [1000, 3000, 7000, 20_000] {
            f.observe(at(&f, len));
            assert_eq!(f.expected_end(), None, "right after a step to {len} us");
            let mut n = 1;
            while f.expected_end().is_none() {
                f.observe(at(&f, len));
                n += 1;
                assert!(n < 40, "{len} us never expected");
            }
            let e = f.expected_end().unwrap().duration_since(f.submitted);
            assert!(e <= Duration::from_micros(len), "{len} us: {e:?}");
        }
    }

    #[test]
    fn a_bound_before_the_average_pulls_the_expectation_below_it() {
        let f = forecast(6006);
        for _ in 0..10 {
            f.observe(at(&f, 30_000));
        }
        // Found done: later than the average teaches nothing.
        f.observe_by(at(&f, 40_000));
        let e = f.expected_end().unwrap().duration_since(f.submitted);
        assert!(e > Duration::from_micros(29_000), "{e:?}");
        // Ops of the kind now end by 1 ms: a few bounds take the too-late
        // expectation away at once, and more bring it back under 1 ms.
        f.observe_by(at(&f, 1000));
        assert_eq!(f.expected_end(), None, "a 30 ms expectation kept");
        let mut n = 0;
        while f
            .expected_end()
            .is_none_or(|e| e.duration_since(f.submitted) > Duration::from_micros(1000))
        {
            f.observe_by(at(&f, 1000));
            n += 1;
            assert!(n < 60, "never expected again under 1 ms");
        }
        // A bound teaches only what is before the average.
        let g = forecast(7007);
        g.observe_by(at(&g, 500));
        g.observe_by(at(&g, 500));
        assert_eq!(g.expected_end(), None, "no history from bounds alone");
    }

    #[test]
    fn keys_do_not_mix() {
        let a = forecast(4004);
        let b = forecast(5005);
        a.observe(at(&a, 1000));
        a.observe(at(&a, 1000));
        assert!(a.expected_end().is_some());
        assert!(b.expected_end().is_none());
    }
}
