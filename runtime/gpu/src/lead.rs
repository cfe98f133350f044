//! The pre-wake's lead in force: the configured one, longer while woken
//! threads run late (docs/ARCHITECTURE.md, "Waking on time").
//!
//! The reactor wakes an awaited op's future `lead` before the op's
//! expected end, and the future sees the end within microseconds only if
//! it runs again before then (less its close spin). A thread parked for a
//! millisecond or more usually runs again well within the configured lead
//! (500 µs by default) of its wake-up. But a host has stretches where
//! such wake-ups take milliseconds: then every pre-woken op is seen late
//! by as much (its driver waiter, woken late too, does no better).
//!
//! So, where the lead may grow, each future the reactor pre-wakes tells
//! how long after its due instant it ran ([`note`]); the reactor's own
//! wake-up for it, late in such a stretch too, is part of that. The lead in force ([`lead`]) is
//! the configured one, or the longest recent such delay plus the close
//! spin, whichever is longer, at most `ReactorConfig::prewake_max` (2 ms
//! by default; a cap at the configured lead keeps the lead fixed, see
//! `ReactorConfig::prewake_max` for what a longer lead costs). "Recent"
//! decays two ways: each report takes a sixteenth off the
//! remembered delay before comparing, and the delay halves for every
//! [`HALF_LIFE`] without a report (ops that a longer lead makes short
//! enough to be watched from their first poll report nothing). A longer
//! lead costs a woken future a few more naps (a few µs of CPU each), not
//! a longer spin; but the thread naps instead of parking for that much
//! longer, hence the cap. Delays within the configured lead change
//! nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::config::ReactorConfig;

/// Without a report for this long, the remembered delay halves.
pub(crate) const HALF_LIFE: Duration = Duration::from_millis(250);

/// The remembered delay (µs, high half) and when it was last reported
/// (ms since [`epoch`], low half); 0: none.
static STATE: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u32 {
    // Wraps after 49 days; only differences are used.
    epoch().elapsed().as_millis() as u32
}

fn pack(delay_us: u32, at_ms: u32) -> u64 {
    (u64::from(delay_us) << 32) | u64::from(at_ms)
}

fn unpack(v: u64) -> (u32, u32) {
    ((v >> 32) as u32, v as u32)
}

/// A pre-woken future ran `delay` after its pre-wake was due.
pub(crate) fn note(delay: Duration) {
    let us = u32::try_from(delay.as_micros()).unwrap_or(u32::MAX);
    let now = now_ms();
    let _ = STATE.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
        let (d, at) = unpack(old);
        Some(pack(after_report(current(d, at, now), us), now))
    });
}

/// The remembered delay `d` (µs) after a report of `us`.
fn after_report(d: u32, us: u32) -> u32 {
    (d - d / 16).max(us)
}

/// The delay `d` (µs) reported at `at`, as it stands at `now` (ms).
fn current(d: u32, at: u32, now: u32) -> u32 {
    let halvings = now.wrapping_sub(at) / HALF_LIFE.as_millis() as u32;
    d.checked_shr(halvings).unwrap_or(0)
}

/// The lead in force under `config` (zero if the pre-wake is off).
pub(crate) fn lead(config: &ReactorConfig) -> Duration {
    lead_at(config, STATE.load(Ordering::Relaxed), now_ms)
}

/// [`lead`] with the remembered `state`, reading the clock (`now`, ms)
/// only where the answer depends on it: not for a fixed lead, nor while
/// the remembered delay, which only decays, is within the configured
/// lead (the usual case on a prompt host).
fn lead_at(config: &ReactorConfig, state: u64, now: impl FnOnce() -> u32) -> Duration {
    if config.prewake_max <= config.prewake_lead {
        return config.prewake_lead;
    }
    let (d, at) = unpack(state);
    let remembered = Duration::from_micros(u64::from(d));
    if remembered + config.watch_spin <= config.prewake_lead {
        return config.prewake_lead;
    }
    let d = current(d, at, now());
    lead_for(config, Duration::from_micros(u64::from(d)))
}

/// The lead under `config` after a remembered delay of `delay`.
fn lead_for(config: &ReactorConfig, delay: Duration) -> Duration {
    let base = config.prewake_lead;
    if base.is_zero() {
        return base;
    }
    base.max((delay + config.watch_spin).min(config.prewake_max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lead_covers_a_late_wake_up_and_no_more_than_the_cap() {
        let us = Duration::from_micros;
        let c = ReactorConfig::default();
        assert_eq!(c.prewake_max, us(2000));
        assert_eq!(lead_for(&c, Duration::ZERO), c.prewake_lead);
        // Usual delays are within the configured lead.
        assert_eq!(lead_for(&c, us(280)), c.prewake_lead);
        // A late one: the delay and the close spin.
        assert_eq!(lead_for(&c, us(1200)), us(1200) + c.watch_spin);
        assert_eq!(lead_for(&c, us(30_000)), c.prewake_max);
        // A cap at the lead keeps it fixed; off stays off.
        let fixed = ReactorConfig {
            prewake_max: c.prewake_lead,
            ..c
        };
        assert_eq!(lead_for(&fixed, us(1200)), c.prewake_lead);
        let off = ReactorConfig {
            prewake_lead: Duration::ZERO,
            ..c
        };
        assert_eq!(lead_for(&off, us(1200)), Duration::ZERO);
    }

    #[test]
    fn the_clock_is_read_only_for_a_delay_past_the_configured_lead() {
        let us = Duration::from_micros;
        let c = ReactorConfig::default();
        let no_clock = || -> u32 { panic!("the clock was read") };
        // Nothing remembered, or a usual delay: the configured lead.
        assert_eq!(lead_at(&c, 0, no_clock), c.prewake_lead);
        assert_eq!(lead_at(&c, pack(280, 7), no_clock), c.prewake_lead);
        // A fixed lead, whatever is remembered.
        let fixed = ReactorConfig {
            prewake_max: c.prewake_lead,
            ..c
        };
        assert_eq!(lead_at(&fixed, pack(1200, 7), no_clock), c.prewake_lead);
        // A late one, reported now, then two half-lives ago.
        let h = HALF_LIFE.as_millis() as u32;
        assert_eq!(lead_at(&c, pack(1200, 7), || 7), us(1200) + c.watch_spin);
        assert_eq!(lead_at(&c, pack(1200, 7), || 7 + 2 * h), c.prewake_lead);
    }

    #[test]
    fn a_late_wake_up_is_remembered_then_forgotten_by_reports() {
        // A stretch of late wake-ups sets the delay at once...
        let mut d = 0;
        for late in [2000, 1000, 2000] {
            d = after_report(d, late);
        }
        assert!(d >= 2000 - 2000 / 16);
        // ...and usual ones (100 µs) bring it back within the configured
        // lead a few dozen reports later, never below what they report.
        let mut reports = 0;
        while d > 450 {
            d = after_report(d, 100);
            reports += 1;
        }
        assert!((15..60).contains(&reports), "{reports} reports");
        for _ in 0..200 {
            d = after_report(d, 100);
        }
        assert_eq!(d, 100);
    }

    #[test]
    fn without_reports_the_delay_halves_each_half_life() {
        let h = HALF_LIFE.as_millis() as u32;
        assert_eq!(current(2000, 100, 100), 2000);
        assert_eq!(current(2000, 100, 100 + h - 1), 2000);
        assert_eq!(current(2000, 100, 100 + h), 1000);
        assert_eq!(current(2000, 100, 100 + 3 * h), 250);
        assert_eq!(current(2000, 100, 100 + 40 * h), 0);
        // Across the millisecond counter's wrap.
        assert_eq!(current(2000, u32::MAX - 10, h - 11), 1000);
        let (d, at) = unpack(pack(1234, u32::MAX));
        assert_eq!((d, at), (1234, u32::MAX));
    }
}
