//! When the watchdog thread next wakes: the earlier of the wake-up it set
//! itself (its next asynchronous-error checks) and the earliest deadline
//! of an op entered since it last looked.
//!
//! The watchdog sets its wake-up with [`Alarm::sleep_until`]. Every group's
//! registry tells [`Alarm::ring_by`] the deadline of each op it enters
//! (`Registry::set_deadline_hook`); a deadline earlier than the wake-up set
//! brings it forward and unparks the thread, which then sleeps again until
//! the new instant. The common case — a deadline minutes away, after the
//! wake-up already set — costs the submitting thread one atomic load.
//!
//! While the watchdog is awake ([`Alarm::awake`] to its next sleep), every
//! deadline entered rings: the round that is running may have scanned that
//! registry already, so the next sleep must know of it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::{Duration, Instant};

/// The watchdog thread's next wake-up, which submitting threads may bring
/// forward.
#[derive(Debug)]
pub(super) struct Alarm {
    /// Instants are kept as nanoseconds since this one.
    epoch: Instant,
    /// The wake-up, in nanoseconds since `epoch`; `u64::MAX` while awake.
    next: AtomicU64,
    /// The thread that sleeps ([`attach`](Self::attach)).
    thread: OnceLock<Thread>,
}

impl Alarm {
    pub(super) fn new() -> Self {
        Alarm {
            epoch: Instant::now(),
            next: AtomicU64::new(u64::MAX),
            thread: OnceLock::new(),
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        let d = t.saturating_duration_since(self.epoch);
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1)
    }

    /// Makes the calling thread the one that [`sleep_until`](Self::sleep_until)
    /// and [`ring_by`](Self::ring_by) unparks. Only the first call counts.
    pub(super) fn attach(&self) {
        let _ = self.thread.set(std::thread::current());
    }

    /// Brings the wake-up forward to `t` if it is set later, and wakes the
    /// thread to sleep again until `t`. Does not block.
    pub(super) fn ring_by(&self, t: Instant) {
        let ns = self.ns(t);
        if ns >= self.next.load(Ordering::Acquire) {
            return;
        }
        if self.next.fetch_min(ns, Ordering::AcqRel) > ns {
            if let Some(thread) = self.thread.get() {
                thread.unpark();
            }
        }
    }

    /// The thread is awake and about to look at every registry: from now
    /// until its next sleep every deadline entered rings.
    pub(super) fn awake(&self) {
        self.next.store(u64::MAX, Ordering::Release);
    }

    /// Sleeps until `t`, or until an earlier instant rung since
    /// [`awake`](Self::awake). Returns at once if that is past.
    pub(super) fn sleep_until(&self, t: Instant) {
        self.next.fetch_min(self.ns(t), Ordering::AcqRel);
        loop {
            let due = self.next.load(Ordering::Acquire);
            let now = self.ns(Instant::now());
            if now >= due {
                return;
            }
            // A ring unparks the thread: it comes back here and sleeps
            // until the new, earlier instant.
            std::thread::park_timeout(Duration::from_nanos(due - now));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Bound on every wait: reaching it is a failure, not a measurement.
    const BOUND: Duration = Duration::from_secs(10);

    /// Runs `sleep_until(now + asleep)` on a thread attached to `alarm` and
    /// returns how long it took, once `ring` has run on this thread.
    fn sleep_with(alarm: &Arc<Alarm>, asleep: Duration, ring: impl FnOnce(&Alarm)) -> Duration {
        let (tx, rx) = std::sync::mpsc::channel();
        let a = alarm.clone();
        let sleeper = std::thread::spawn(move || {
            a.attach();
            let t0 = Instant::now();
            tx.send(()).unwrap();
            a.sleep_until(t0 + asleep);
            t0.elapsed()
        });
        rx.recv_timeout(BOUND).unwrap();
        ring(alarm);
        sleeper.join().unwrap()
    }

    #[test]
    fn an_unrung_sleep_lasts_until_its_instant() {
        let alarm = Arc::new(Alarm::new());
        let took = sleep_with(&alarm, Duration::from_millis(100), |_| {});
        assert!(took >= Duration::from_millis(100), "{took:?}");
    }

    #[test]
    fn an_earlier_deadline_ends_the_sleep_at_that_deadline() {
        let alarm = Arc::new(Alarm::new());
        let took = sleep_with(&alarm, BOUND * 3, |a| {
            std::thread::sleep(Duration::from_millis(20));
            a.ring_by(Instant::now() + Duration::from_millis(50));
        });
        assert!(
            took >= Duration::from_millis(70),
            "woke before it: {took:?}"
        );
        assert!(took < BOUND, "slept past it: {took:?}");
    }

    #[test]
    fn a_later_deadline_leaves_the_sleep_alone() {
        let alarm = Arc::new(Alarm::new());
        let took = sleep_with(&alarm, Duration::from_millis(200), |a| {
            a.ring_by(Instant::now() + BOUND * 3);
        });
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(took < BOUND, "{took:?}");
    }

    #[test]
    fn a_deadline_rung_while_awake_shortens_the_next_sleep() {
        let alarm = Alarm::new();
        alarm.attach();
        alarm.awake();
        let t0 = Instant::now();
        alarm.ring_by(t0 + Duration::from_millis(50));
        alarm.sleep_until(t0 + BOUND * 3);
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(50), "{took:?}");
        assert!(took < BOUND, "{took:?}");
    }
}
