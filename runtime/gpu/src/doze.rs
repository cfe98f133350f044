//! Short, precise naps for a thread that must be awake at a known instant
//! (docs/ARCHITECTURE.md, "Waking on time").
//!
//! A future woken ahead of its op's expected end has to see the end within
//! microseconds, but spinning all the way to it costs the whole lead per
//! op. A thread that is already running can instead nap: half the way
//! to the expected end while it is far, then steps of a few dozen
//! microseconds. The core it naps on stays in a shallow idle state, so
//! each nap ends within a few microseconds of its time, and the thread
//! spins only for the last stretch before the expected end
//! (`ReactorConfig::watch_spin`, 20 µs by default: more than a nap's
//! overshoot; the expectation is early by twice its ops' deviation
//! already). The
//! default timer slack of a Linux thread (50 µs) would stretch every step,
//! so a [`Doze`] sets the calling thread's slack to 1 µs while it naps and
//! puts the old value back when dropped.

use std::time::{Duration, Instant};

/// The longest nap: long enough that its system calls cost a few percent
/// of it, short enough that an op ending earlier than expected is still
/// seen within the latency goal (docs/ARCHITECTURE.md).
pub const STEP: Duration = Duration::from_micros(40);

/// Naps of the calling thread, with its timer slack fine until dropped.
///
/// `!Send`: the slack belongs to the thread that set it.
#[derive(Debug)]
pub struct Doze {
    /// The thread's slack before, in ns, to put back (`None`: not changed).
    previous: Option<u64>,
    _thread: std::marker::PhantomData<*const ()>,
}

impl Default for Doze {
    fn default() -> Self {
        Self::new()
    }
}

impl Doze {
    /// Makes the calling thread's timer slack fine (1 µs) until dropped.
    /// Where that cannot be done the naps are only less precise.
    pub fn new() -> Doze {
        #[cfg(target_os = "linux")]
        let previous = nix::sys::prctl::get_timerslack()
            .ok()
            .and_then(|ns| u64::try_from(ns).ok())
            .filter(|&ns| ns > 1_000)
            .filter(|_| nix::sys::prctl::set_timerslack(1_000).is_ok());
        #[cfg(not(target_os = "linux"))]
        let previous = None;
        Doze {
            previous,
            _thread: std::marker::PhantomData,
        }
    }

    /// Sleeps towards `close`: half the way while that is more than
    /// [`STEP`], then steps of [`STEP`], never longer than `longest` (a
    /// `longest` of [`STEP`] naps in even steps). Returns false (without
    /// sleeping) once `close` has come: the caller should spin from then
    /// on.
    ///
    /// Halving keeps the wake-ups few (a handful for a 500 µs lead,
    /// against a dozen in even steps) while the last naps, the ones an op
    /// that ends early is most likely to fall into, stay short.
    pub fn nap_until(&mut self, close: Instant, longest: Duration) -> bool {
        let left = close.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(nap(left, longest));
        true
    }
}

/// The nap towards an instant `left` away (see [`Doze::nap_until`]).
fn nap(left: Duration, longest: Duration) -> Duration {
    (left / 2)
        .max(STEP)
        .min(left)
        .min(longest.max(Duration::from_micros(1)))
}

impl Drop for Doze {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if let Some(ns) = self.previous {
            let _ = nix::sys::prctl::set_timerslack(ns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn naps_stop_at_the_close_instant_and_the_slack_comes_back() {
        #[cfg(target_os = "linux")]
        let before = nix::sys::prctl::get_timerslack().expect("get slack");
        let close = Instant::now() + Duration::from_millis(2);
        {
            let mut d = Doze::new();
            #[cfg(target_os = "linux")]
            assert_eq!(nix::sys::prctl::get_timerslack().expect("slack"), 1_000);
            while d.nap_until(close, Duration::from_secs(1)) {}
            assert!(Instant::now() >= close);
            // One nap is one step, not the way to a far instant.
            let t = Instant::now();
            assert!(d.nap_until(t + Duration::from_secs(30), STEP));
            assert!(t.elapsed() < Duration::from_secs(10));
            assert!(!d.nap_until(close, STEP));
        }
        #[cfg(target_os = "linux")]
        assert_eq!(nix::sys::prctl::get_timerslack().expect("slack"), before);
    }

    #[test]
    fn naps_halve_the_way_then_step_and_never_pass_the_longest() {
        let us = Duration::from_micros;
        let long = us(250);
        // A 450 µs way: halved while far, then steps, then the rest.
        let mut left = us(450);
        let mut naps = Vec::new();
        while !left.is_zero() {
            let n = nap(left, long);
            naps.push(n.as_micros());
            left -= n;
        }
        assert_eq!(naps, [225, 112, 56, 40, 16]);
        // Capped by the longest nap; even steps when that is STEP.
        assert_eq!(nap(us(2000), long), long);
        assert_eq!(nap(us(450), STEP), STEP);
        assert_eq!(nap(us(30), STEP), us(30));
        assert_eq!(nap(us(30), long), us(30));
    }
}
