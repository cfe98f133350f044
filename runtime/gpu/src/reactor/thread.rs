//! The reactor thread: its loop of rounds over the entries it polls (spin,
//! yield, sleep, park), the pre-wakes it gives, and the exit gate around
//! every round.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pending::Pending;
use super::shared::Shared;
use crate::config::ReactorConfig;
use crate::exit_gate;
use chorus_core::sync::lock;

struct Done;
impl Pending for Done {
    fn poll_complete(&mut self) -> bool {
        true
    }
}

/// Polls one entry, leaking it if it panics (its buffers may still be in use
/// by the GPU, so dropping it would be unsound for raw-pointer users).
pub(super) fn poll_one(entry: &mut Box<dyn Pending>) -> Option<bool> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| entry.poll_complete())).ok()
}

/// With nothing to watch, yield at most this long before parking.
const IDLE_YIELD: Duration = Duration::from_millis(1);

/// Polls each of `entries` once (in an ordered queue, none after a pending
/// one) and drops those that completed; returns how many did.
fn poll_round(
    entries: &mut Vec<Box<dyn Pending>>,
    blocked: &mut Vec<(u64, u64)>,
    shared: &Shared,
) -> usize {
    let before = entries.len();
    blocked.clear();
    entries.retain_mut(|e| {
        let order = e.order();
        if let Some((q, pos)) = order {
            // Later on the stream than a pending op, or at its position
            // (one launch, one end event): pending too.
            if blocked.iter().any(|&(bq, bpos)| bq == q && pos >= bpos) {
                return true;
            }
        }
        match poll_one(e) {
            Some(false) => {
                if let Some((q, pos)) = order {
                    match blocked.iter_mut().find(|(bq, _)| *bq == q) {
                        Some(b) => b.1 = b.1.min(pos),
                        None => blocked.push((q, pos)),
                    }
                }
                true
            }
            Some(true) => {
                shared.completed.fetch_add(1, Ordering::Relaxed);
                false
            }
            None => {
                tracing::error!("a completion entry panicked; its buffers are leaked");
                std::mem::forget(std::mem::replace(e, Box::new(Done)));
                shared.completed.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    });
    before - entries.len()
}

/// [`poll_round`] inside the exit gate; `None` once the process exits.
fn gated_round(
    entries: &mut Vec<Box<dyn Pending>>,
    blocked: &mut Vec<(u64, u64)>,
    shared: &Shared,
) -> Option<usize> {
    let _gate = exit_gate::enter()?;
    Some(poll_round(entries, blocked, shared))
}

/// The process is exiting: touch nothing again (the entries and their
/// buffers stay as they are, for the process's end).
pub(super) fn stop_for_exit() -> ! {
    loop {
        std::thread::park();
    }
}

pub(super) fn run(shared: Arc<Shared>) {
    let cfg = shared.config;
    // The driver was used before the first registration: the exit handler
    // registered now runs before the driver's own.
    exit_gate::install();
    // Short sleeps must be short: the default timer slack (50 µs) would
    // stretch every one of them.
    #[cfg(target_os = "linux")]
    let _ = nix::sys::prctl::set_timerslack(1_000);
    // Entries someone waits for: checked every round.
    let mut local: Vec<Box<dyn Pending>> = Vec::new();
    // Detached entries: checked once per `detached_poll`.
    let mut slow: Vec<Box<dyn Pending>> = Vec::new();
    let mut blocked: Vec<(u64, u64)> = Vec::new();
    let mut last_progress = Instant::now();
    let mut next_slow = last_progress;
    // The last round slept: the ops being watched had run long.
    let mut slept = false;
    let Some(bell) = shared.bell.get() else {
        // `Reactor::thread` made it before starting this thread.
        tracing::error!("the completion reactor has no timer; it stops");
        stop_for_exit();
    };
    // The last completion ended such a long wait: no stream of short ops
    // is running, so there is no next one to stay awake for.
    let mut after_long = false;
    loop {
        // Read before writing: a swap on every round would steal the cache
        // line from registering threads.
        if shared.wake.load(Ordering::Relaxed) && shared.wake.swap(false, Ordering::SeqCst) {
            let mut inc = lock(&shared.incoming);
            local.append(&mut inc);
            drop(inc);
            last_progress = Instant::now();
            after_long = false;
        }
        let now = Instant::now();
        if now >= next_slow {
            slow.append(&mut lock(&shared.detached));
            if !slow.is_empty() && gated_round(&mut slow, &mut blocked, &shared).is_none() {
                stop_for_exit();
            }
            next_slow = now + cfg.detached_poll;
        }
        if local.is_empty() {
            if !slow.is_empty() {
                // Only detached entries: sleep until their next check.
                shared.sleeping.store(true, Ordering::SeqCst);
                if !shared.wake.load(Ordering::SeqCst) {
                    bell.sleep(Some(next_slow));
                }
                shared.sleeping.store(false, Ordering::SeqCst);
                continue;
            }
            // Stay responsive for a moment (ops often come in a stream, and
            // a registration that finds the thread awake needs no unpark
            // system call); then park until the next registration.
            let idle = now.saturating_duration_since(last_progress);
            if idle < cfg.spin && !after_long {
                std::hint::spin_loop();
                continue;
            }
            if idle < cfg.yield_for.min(IDLE_YIELD) && !after_long {
                std::thread::yield_now();
                continue;
            }
            shared.sleeping.store(true, Ordering::SeqCst);
            shared.parked.store(true, Ordering::SeqCst);
            let detached = !lock(&shared.detached).is_empty();
            if !detached && !shared.wake.load(Ordering::SeqCst) {
                shared.parks.fetch_add(1, Ordering::Relaxed);
                bell.sleep(None);
            }
            shared.parked.store(false, Ordering::SeqCst);
            shared.sleeping.store(false, Ordering::SeqCst);
            // Check detached entries that arrived while parked at once.
            next_slow = Instant::now();
            continue;
        }
        let Some(done) = gated_round(&mut local, &mut blocked, &shared) else {
            stop_for_exit();
        };
        if done > 0 {
            last_progress = Instant::now();
            after_long = slept;
            slept = false;
            continue;
        }
        // Wake the awaiting futures of ops due to end within the lead, and
        // find when the next one is due.
        let mut next_prewake: Option<Instant> = None;
        // True while every entry's end is expected later: nothing is likely
        // to finish before the next pre-wake.
        let lead = crate::lead::lead(&cfg);
        let mut all_expected = !lead.is_zero();
        // True while every entry needs the thread only at its pre-wake.
        let mut timers_only = true;
        // A pre-wake-only entry gave its pre-wake: it is done.
        let mut fired = false;
        if !lead.is_zero() {
            for e in local.iter_mut() {
                let timer = e.timer_only();
                timers_only &= timer;
                let Some(end) = e.expected_end() else {
                    all_expected &= timer;
                    continue;
                };
                let at = end.checked_sub(lead).unwrap_or(now);
                if at <= now {
                    e.prewake(lead);
                    fired |= timer;
                    all_expected &= timer;
                } else {
                    next_prewake = Some(next_prewake.map_or(at, |n| n.min(at)));
                }
            }
        }
        if fired {
            let before = local.len();
            local.retain_mut(|e| !(e.timer_only() && poll_one(e) != Some(false)));
            shared
                .completed
                .fetch_add((before - local.len()) as u64, Ordering::Relaxed);
            if local.is_empty() {
                continue;
            }
        }
        let idle = now.saturating_duration_since(last_progress);
        // While every op is expected to end after its pre-wake, there is
        // nothing to spin for (a registration or a nudge does not change
        // that): sleep towards the pre-wake at once.
        if idle < cfg.spin && !all_expected {
            // A short pause between rounds of driver queries, so that the
            // threads enqueueing work do not contend with a tight loop.
            for _ in 0..32 {
                std::hint::spin_loop();
            }
            slept = false;
        } else if idle < cfg.yield_for && !all_expected {
            std::thread::yield_now();
            slept = false;
        } else {
            slept = true;
            // Sleep a fraction of how long the ops have run (a check every
            // eighth of their age keeps an unexpected end within ~12% of
            // the op's length), but not past a pre-wake or the detached
            // entries' next check.
            let mut d = (idle / 8).clamp(MIN_SLEEP, cfg.max_sleep.max(MIN_SLEEP));
            if all_expected {
                // Every op is expected to run past its pre-wake: sleep up to
                // it (a few wake-ups per op), looking in at least every
                // eight `max_sleep`s in case one ends early (an op that
                // ends well before ops like it did is then seen within
                // 8 ms by default) — unless driver waiters watch them all.
                d = if timers_only && next_prewake.is_some() {
                    Duration::MAX
                } else {
                    look_in(&cfg)
                };
            }
            if !slow.is_empty() {
                d = d.min(next_slow.saturating_duration_since(now));
            }
            if let Some(at) = next_prewake {
                d = d.min(at.saturating_duration_since(now));
            }
            shared.sleeping.store(true, Ordering::SeqCst);
            if !shared.wake.load(Ordering::SeqCst) {
                bell.sleep(Some(now + d));
            }
            shared.sleeping.store(false, Ordering::SeqCst);
        }
    }
}

/// The shortest sleep between rounds.
const MIN_SLEEP: Duration = Duration::from_micros(10);

/// How often the thread looks in while every op it holds is expected to
/// end later (or is watched by its waiter): eight `max_sleep`s.
fn look_in(cfg: &ReactorConfig) -> Duration {
    cfg.max_sleep.max(MIN_SLEEP) * 8
}
