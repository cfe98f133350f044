//! The GPU layer's settings, and the one place where it reads the
//! environment (`CHORUS_REACTOR_*`). Every variable has a builder
//! equivalent: a field of [`ReactorConfig`], given to
//! [`reactor::configure`](crate::reactor::configure). docs/CONFIG.md lists
//! every variable of every layer.

use std::time::Duration;

/// How the reactor thread backs off while entries are pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReactorConfig {
    /// Spin (no yield, no sleep) for this long after the last progress.
    pub spin: Duration,
    /// Then yield the core between rounds until this long after the last
    /// progress.
    pub yield_for: Duration,
    /// Then sleep between rounds for an eighth of how long the ops have
    /// run, from 10 µs up to this.
    pub max_sleep: Duration,
    /// Detached entries are checked this often.
    pub detached_poll: Duration,
    /// Wake an awaited op's future this long before the op's expected end
    /// (learned from ops like it), so that it is awake to see it; zero
    /// turns the pre-wake off. The least lead: while woken threads run
    /// later than it covers, the lead in force is their delay and
    /// `watch_spin`, up to `prewake_max`
    /// ([`Reactor::prewake_lead`](crate::reactor::Reactor::prewake_lead)).
    pub prewake_lead: Duration,
    /// The longest lead late wake-ups can make (2 ms); `prewake_lead` or
    /// less keeps the lead fixed. A longer lead covers hosts whose parked
    /// threads run again milliseconds late, while they do, at a cost: a
    /// woken future naps, not parks, through the lead (on an executor's
    /// thread, its other tasks wait meanwhile, as they would for the
    /// host's late wake-ups). Its watch still ends the configured lead
    /// past the op's expected end, spinning no longer than half of it; see
    /// `lead.rs`.
    pub prewake_max: Duration,
    /// A future so woken naps in short steps (`chorus_gpu::doze`) until
    /// this long before the expected end, then spins; a value of
    /// `prewake_lead` or more makes it spin all the way.
    pub watch_spin: Duration,
    /// The longest of those naps: they halve the way to `watch_spin`
    /// before the expected end, in steps of at least
    /// [`doze::STEP`](crate::doze::STEP) and at most this; a value of
    /// `STEP` (40 µs) naps in even steps.
    pub watch_nap: Duration,
    /// A driver waiter (a thread that sleeps in the driver until an
    /// awaited op's end) with nothing to wait for ends after this long.
    pub waiter_linger: Duration,
}

impl Default for ReactorConfig {
    fn default() -> Self {
        ReactorConfig {
            spin: Duration::from_micros(50),
            yield_for: Duration::ZERO,
            max_sleep: Duration::from_millis(1),
            detached_poll: Duration::from_micros(50),
            prewake_lead: Duration::from_micros(500),
            prewake_max: Duration::from_millis(2),
            watch_spin: Duration::from_micros(20),
            watch_nap: Duration::from_micros(120),
            waiter_linger: Duration::from_secs(10),
        }
    }
}

impl ReactorConfig {
    /// The defaults, overridden by `CHORUS_REACTOR_SPIN_US`,
    /// `CHORUS_REACTOR_YIELD_US`, `CHORUS_REACTOR_MAX_SLEEP_US`,
    /// `CHORUS_REACTOR_DETACHED_US`, `CHORUS_REACTOR_PREWAKE_US`,
    /// `CHORUS_REACTOR_PREWAKE_MAX_US`, `CHORUS_REACTOR_WATCH_SPIN_US` and
    /// `CHORUS_REACTOR_WATCH_NAP_US`
    /// (microseconds).
    pub fn from_env() -> ReactorConfig {
        let us = |name: &str| micros(std::env::var(name).ok().as_deref());
        let d = ReactorConfig::default();
        ReactorConfig {
            spin: us("CHORUS_REACTOR_SPIN_US").unwrap_or(d.spin),
            yield_for: us("CHORUS_REACTOR_YIELD_US").unwrap_or(d.yield_for),
            max_sleep: us("CHORUS_REACTOR_MAX_SLEEP_US")
                .unwrap_or(d.max_sleep)
                .max(Duration::from_micros(1)),
            detached_poll: us("CHORUS_REACTOR_DETACHED_US")
                .unwrap_or(d.detached_poll)
                .max(Duration::from_micros(1)),
            prewake_lead: us("CHORUS_REACTOR_PREWAKE_US").unwrap_or(d.prewake_lead),
            prewake_max: us("CHORUS_REACTOR_PREWAKE_MAX_US").unwrap_or(d.prewake_max),
            watch_spin: us("CHORUS_REACTOR_WATCH_SPIN_US").unwrap_or(d.watch_spin),
            watch_nap: us("CHORUS_REACTOR_WATCH_NAP_US").unwrap_or(d.watch_nap),
            waiter_linger: d.waiter_linger,
        }
    }
}

/// A variable's value as microseconds; `None` when unset or not a number.
fn micros(v: Option<&str>) -> Option<Duration> {
    v.and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn microsecond_values_parse_and_junk_is_ignored() {
        assert_eq!(micros(Some(" 250 ")), Some(Duration::from_micros(250)));
        assert_eq!(micros(Some("fast")), None);
        assert_eq!(micros(None), None);
    }
}
