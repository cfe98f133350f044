//! Short, precise naps for a thread that must be awake at a known instant
//! (docs/ARCHITECTURE.md, "Waking on time").
//!
//! A future woken ahead of its op's expected end has to see the end within
//! microseconds, but spinning all the way to it costs the whole lead (half
//! a millisecond per op, a few percent of a core for a stream of 30 ms
//! ops). A thread that is already running can instead sleep in steps of a
//! few dozen microseconds: the core it sleeps on stays in a shallow idle
//! state, so each step ends within a few microseconds of its time, and the
//! thread spins only for the last stretch before the expected end
//! (`ReactorConfig::watch_spin`, 50 µs by default: a nap's overshoot and
//! the expectation's usual error). The
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

    /// Sleeps towards `close`, at most [`STEP`]. Returns false (without
    /// sleeping) once `close` has come: the caller should spin from then
    /// on.
    pub fn nap_until(&mut self, close: Instant) -> bool {
        let left = close.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(left.min(STEP));
        true
    }
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
            while d.nap_until(close) {}
            assert!(Instant::now() >= close);
            // One nap is one step, not the way to a far instant.
            let t = Instant::now();
            assert!(d.nap_until(t + Duration::from_secs(30)));
            assert!(t.elapsed() < Duration::from_secs(10));
            assert!(!d.nap_until(close));
        }
        #[cfg(target_os = "linux")]
        assert_eq!(nix::sys::prctl::get_timerslack().expect("slack"), before);
    }
}
