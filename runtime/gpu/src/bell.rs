//! The completion reactor's sleep: other threads can end it at once
//! ([`Bell::ring`]) or move its end earlier ([`Bell::ring_by`]) without
//! waking the thread before then (docs/ARCHITECTURE.md, "Waking on time").
//!
//! An op whose end is expected needs the reactor only at its pre-wake
//! instant. Waking the reactor when the op is registered, only for it to
//! learn that instant and sleep again, costs a cold wake-up per op (tens of
//! microseconds of CPU on a large host). So the reactor sleeps on a
//! `timerfd` that the registering thread re-arms to the pre-wake instant
//! when that comes before the reactor's own wake-up: one system call on
//! the registering thread instead of a wake-up. Elsewhere than Linux the
//! bell parks the thread, and `ring_by` wakes it at once.

use chorus_core::sync::lock;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Sleep and wake-ups of one thread (the one that calls [`sleep`](Self::sleep)).
pub(crate) struct Bell {
    state: Mutex<State>,
    waker: Waker,
}

#[derive(Default)]
struct State {
    /// While the thread sleeps: when it wakes (`None`: only when rung).
    armed: Option<Option<Instant>>,
    /// Rung while the thread was awake: its next sleep returns at once.
    rung: bool,
    /// Asked for while the thread was awake: its next sleep ends by then.
    wanted: Option<Instant>,
}

fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl Bell {
    /// A bell for the calling thread (on Linux: its timer).
    ///
    /// # Errors
    ///
    /// The OS error of creating the timer.
    pub(crate) fn new() -> std::io::Result<Bell> {
        Ok(Bell {
            state: Mutex::new(State::default()),
            waker: Waker::new()?,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Sleeps until `until` (`None`: until rung), an earlier instant a
    /// [`ring_by`](Self::ring_by) asked for, or a [`ring`](Self::ring).
    /// Returns at once if rung since the last sleep. May return early.
    pub(crate) fn sleep(&self, until: Option<Instant>) {
        let mut st = self.lock();
        let until = earlier(until, st.wanted.take());
        if std::mem::take(&mut st.rung) {
            return;
        }
        if until.is_some_and(|u| u <= Instant::now()) {
            return;
        }
        st.armed = Some(until);
        self.waker.arm(until);
        drop(st);
        self.waker.wait();
        let mut st = self.lock();
        st.armed = None;
        st.rung = false;
    }

    /// Ends the thread's sleep now, or its next one at once.
    pub(crate) fn ring(&self) {
        let mut st = self.lock();
        match st.armed {
            Some(_) => {
                st.armed = Some(Some(Instant::now()));
                self.waker.ring();
            }
            None => st.rung = true,
        }
    }

    /// Makes the thread's sleep (this one, or its next) end by `at`, and
    /// no later; it is not woken before then.
    pub(crate) fn ring_by(&self, at: Instant) {
        let mut st = self.lock();
        match st.armed {
            Some(until) if until.is_none_or(|u| at < u) => {
                st.armed = Some(Some(at));
                self.waker.arm_by(at);
            }
            Some(_) => {}
            None => st.wanted = earlier(st.wanted, Some(at)),
        }
    }
}

/// The shortest time a timer is armed for (a zero time would disarm it).
const MIN_ARM: Duration = Duration::from_nanos(1);

#[cfg(target_os = "linux")]
struct Waker {
    timer: nix::sys::timerfd::TimerFd,
}

#[cfg(target_os = "linux")]
impl Waker {
    fn new() -> std::io::Result<Waker> {
        use nix::sys::timerfd::{ClockId, TimerFd, TimerFlags};
        // CLOCK_MONOTONIC is the clock of `Instant` on Linux.
        let timer = TimerFd::new(ClockId::CLOCK_MONOTONIC, TimerFlags::TFD_CLOEXEC)
            .map_err(std::io::Error::from)?;
        Ok(Waker { timer })
    }

    /// Arms the timer for `until` (`None`: disarmed, the thread sleeps
    /// until rung). Called with the bell's state locked.
    fn arm(&self, until: Option<Instant>) {
        use nix::sys::time::TimeSpec;
        use nix::sys::timerfd::{Expiration, TimerSetTimeFlags};
        let r = match until {
            Some(u) => {
                let after = u.saturating_duration_since(Instant::now()).max(MIN_ARM);
                self.timer.set(
                    Expiration::OneShot(TimeSpec::from_duration(after)),
                    TimerSetTimeFlags::empty(),
                )
            }
            None => self.timer.unset(),
        };
        if let Err(e) = r {
            // The sleep then ends at once (see `wait`) rather than never.
            tracing::warn!(error = %e, "cannot arm the reactor's timer");
        }
    }

    fn arm_by(&self, at: Instant) {
        self.arm(Some(at));
    }

    fn ring(&self) {
        self.arm(Some(Instant::now()));
    }

    /// Blocks until the timer expires.
    fn wait(&self) {
        // An error (a signal, a timer that could not be armed) ends the
        // sleep early: the reactor's loop looks again and sleeps anew.
        let _ = self.timer.wait();
    }
}

#[cfg(not(target_os = "linux"))]
struct Waker {
    thread: std::thread::Thread,
    until: Mutex<Option<Instant>>,
}

#[cfg(not(target_os = "linux"))]
impl Waker {
    fn new() -> std::io::Result<Waker> {
        Ok(Waker {
            thread: std::thread::current(),
            until: Mutex::new(None),
        })
    }

    fn arm(&self, until: Option<Instant>) {
        *lock(&self.until) = until;
    }

    /// Without a timer another thread can re-arm, an earlier end wakes the
    /// thread now.
    fn arm_by(&self, _at: Instant) {
        self.thread.unpark();
    }

    fn ring(&self) {
        self.thread.unpark();
    }

    fn wait(&self) {
        let until = *lock(&self.until);
        match until {
            Some(u) => std::thread::park_timeout(u.saturating_duration_since(Instant::now())),
            None => std::thread::park(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn sleeper(bell: Arc<Bell>, until: Option<Instant>) -> std::thread::JoinHandle<Instant> {
        std::thread::spawn(move || {
            bell.sleep(until);
            Instant::now()
        })
    }

    fn until_sleeping(bell: &Bell) {
        while bell.lock().armed.is_none() {
            std::thread::yield_now();
        }
    }

    #[test]
    fn a_sleep_ends_at_its_instant_or_when_rung() {
        let bell = Arc::new(Bell::new().expect("bell"));
        // Its own instant.
        let t0 = Instant::now();
        bell.sleep(Some(t0 + Duration::from_millis(20)));
        assert!(t0.elapsed() >= Duration::from_millis(20));
        // A ring ends a sleep without a timeout.
        let h = sleeper(bell.clone(), None);
        until_sleeping(&bell);
        let rung = Instant::now();
        bell.ring();
        assert!(h.join().expect("sleeper") >= rung);
        // A ring while awake makes the next sleep return at once.
        bell.ring();
        let t = Instant::now();
        bell.sleep(Some(t + Duration::from_secs(30)));
        assert!(t.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn ring_by_moves_the_end_earlier_and_never_later() {
        let bell = Arc::new(Bell::new().expect("bell"));
        // A sleep of 30 s brought forward to 30 ms from now.
        let h = sleeper(bell.clone(), Some(Instant::now() + Duration::from_secs(30)));
        until_sleeping(&bell);
        let by = Instant::now() + Duration::from_millis(30);
        bell.ring_by(by);
        // A later instant changes nothing.
        bell.ring_by(by + Duration::from_secs(60));
        let woke = h.join().expect("sleeper");
        assert!(woke < by + Duration::from_secs(10));
        #[cfg(target_os = "linux")]
        assert!(woke >= by, "woken before the instant asked for");
        // Asked for while awake: the next sleep ends by then.
        let by = Instant::now() + Duration::from_millis(10);
        bell.ring_by(by);
        bell.sleep(None);
        assert!(Instant::now() >= by || cfg!(not(target_os = "linux")));
    }
}
