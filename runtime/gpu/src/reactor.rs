//! The completion reactor: completes in-flight GPU ops when they finish and
//! wakes the futures awaiting them (docs/ARCHITECTURE.md, rule 2 and
//! "Waking on time").
//!
//! A backend hands the reactor one [`Pending`] entry per op it cannot
//! complete itself: typically the op's end event together with its
//! completer and buffers. The NCCL backend does so when a work's poll finds
//! the op still running ([`Reactor::register`]); an op that a poll finds
//! finished never reaches the reactor, and ops nobody waits for any more
//! are retired by the threads that let go of them, with a slow sweeper
//! here for the last ones ([`Reactor::register_detached`]). An entry that
//! finds its event complete (or failed) in [`Pending::poll_complete`]
//! completes its work, which wakes the future awaiting it.
//!
//! # Driver waiters
//!
//! An awaited op is watched by a thread that sleeps in the driver until
//! its end event completes (`waiters`): entries with a
//! [`Pending::sleeper`] and an [`order`](Pending::order) go to their
//! stream's waiter, which sleeps on the stream's earliest pending entry
//! and completes what ended when the GPU wakes it. It costs no CPU while
//! the op runs and sees the end when the driver does, however long the op
//! ran and whatever ran before it.
//!
//! # The reactor thread and the pre-wake
//!
//! A thread parked for a millisecond takes tens to hundreds of
//! microseconds to run again once woken, whoever wakes it. So an op whose
//! end is expected (its [`Pending::expected_end`], learned from ops like
//! it, given only where they ended alike) also has an entry on the
//! reactor thread that wakes its future `prewake_lead` (default 500 µs)
//! before that end ([`Pending::prewake`]): the future then watches the end
//! event itself and sees it within microseconds. The thread sleeps until
//! the first pre-wake; registering such an op does not wake it, but brings
//! its sleep forward to the op's pre-wake if it would end later (it sleeps
//! on a timer others can re-arm, `crate::bell`). The driver waiter
//! completes the op all the same if it ends before its pre-wake, or after
//! the woken future stopped watching.
//!
//! The thread also polls entries that cannot be slept on (no sleeper or
//! no order): it spins (`spin`, default 50 µs since the last progress),
//! may yield its core between rounds (until `yield_for`, default: no
//! yielding), then sleeps between rounds for an eighth of how long the
//! ops have been running (10 µs up to `max_sleep`, default 1 ms, with the
//! thread's timer slack at 1 µs). Any progress (a completion, a new
//! registration, a [`Reactor::nudge`]) starts the spin phase again. With
//! nothing to watch it spins the same way and yields for at most 1 ms,
//! then parks and uses no CPU until the next registration unparks it — at
//! once when the op that just completed had it sleeping.
//!
//! The settings ([`ReactorConfig`]) come from [`configure`], or from the
//! `CHORUS_REACTOR_*` variables (see `crate::config`).
//!
//! # Detached entries
//!
//! Some entries need watching, but not quickly: the sweeper of an NCCL
//! communicator's retire queue (ops nobody waits for any more: their work
//! was dropped, or their buffers were taken back stream-ordered), or a
//! dropped op of a grouped launch. They go in with
//! [`Reactor::register_detached`]: checked once every `detached_poll`
//! (default 50 µs), they never make the thread spin, and their registration
//! costs no wake-up unless the thread is parked. This keeps the reactor's
//! event queries (which contend with the enqueuing threads in the CUDA
//! driver) and its cache traffic off the enqueue path of a stream of ops
//! that nobody awaits one by one.
//!
//! # Safety of buffers
//!
//! An entry owns the op's buffers until it completes; neither the reactor
//! thread nor a driver waiter drops an entry before `poll_complete`
//! returned true. An entry whose
//! `poll_complete` panics is leaked (never dropped), so memory the GPU may
//! still touch is never freed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::bell::Bell;
use crate::exit_gate;

pub use crate::config::ReactorConfig;

mod waiters;

/// How a thread sleeps until an op has ended (see [`Pending::sleeper`]).
pub trait Sleeper: Send + Sync {
    /// Blocks the calling thread, asleep, until the op has ended or failed
    /// (a failure is not reported here: the entry's next poll finds it).
    /// May return earlier when the driver cannot sleep on it; never
    /// returns while the GPU runs otherwise, however long that is. Returns
    /// whether it slept (false: the op had ended already, or the driver
    /// refused).
    fn sleep_until_end(&self) -> bool;
}

/// One watched op.
pub trait Pending: Send + 'static {
    /// Checks the op once, without blocking. When the op has finished (or
    /// failed) it completes its work and returns true; the reactor then drops
    /// the entry. Returns false to be checked again.
    fn poll_complete(&mut self) -> bool;

    /// Where the entry sits in an ordered queue: `(queue, position)`.
    /// Entries of one queue complete in position order (end events recorded
    /// on one stream; entries at one position share one end event), so
    /// while one is pending the reactor skips those at its position or
    /// later in that round: one event query per stream instead of one per
    /// op. `None` (the default): always checked.
    fn order(&self) -> Option<(u64, u64)> {
        None
    }

    /// When the op is expected to end, if an awaiting future should be
    /// woken the lead in force ([`Reactor::prewake_lead`]) before it. The
    /// default: never.
    fn expected_end(&self) -> Option<Instant> {
        None
    }

    /// Wakes the awaiting future ahead of the expected end (once; after it
    /// [`expected_end`](Self::expected_end) returns `None`). `lead` is the
    /// lead in force ([`Reactor::prewake_lead`]): the future was due to be
    /// woken that long before the expected end.
    fn prewake(&mut self, lead: Duration) {
        let _ = lead;
    }

    /// How a thread can sleep until the op ends (in the driver, woken by
    /// the GPU), for an entry someone waits for. Such an entry with an
    /// [`order`](Self::order) is completed by a driver waiter of its queue
    /// (see the module docs), not polled by the reactor thread. `None`
    /// (the default): the reactor thread polls it.
    fn sleeper(&self) -> Option<Arc<dyn Sleeper>> {
        None
    }

    /// True for an entry that needs the reactor thread only at its
    /// pre-wake ([`expected_end`](Self::expected_end)): its op is watched
    /// elsewhere (a driver waiter), and a poll before then asks nothing of
    /// the driver. While every entry is such or expected to end later, the
    /// thread sleeps until the first pre-wake without looking in. The
    /// default: false.
    fn timer_only(&self) -> bool {
        false
    }
}

/// Keeps a value on its own cache line (no false sharing between the
/// registering threads and the reactor thread).
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

struct Done;
impl Pending for Done {
    fn poll_complete(&mut self) -> bool {
        true
    }
}

/// Counters of a reactor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReactorStats {
    /// Entries registered so far.
    pub registered: u64,
    /// Entries that completed.
    pub completed: u64,
    /// Times the thread parked with nothing to watch.
    pub parks: u64,
    /// Driver waiters alive now (sleeping on an op, or idle until they
    /// end).
    pub waiters: u64,
    /// Times a driver waiter slept on an op's end (counted when it woke).
    pub waits: u64,
    /// Driver waiters in a sleep on an op's end now (or about to look
    /// whether it ended).
    pub asleep: u64,
}

/// The reactor could not start its thread.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the chorus completion reactor thread: {reason}")]
pub struct ReactorError {
    /// The OS error text.
    pub reason: String,
}

struct Shared {
    incoming: Padded<Mutex<Vec<Box<dyn Pending>>>>,
    /// Detached entries, taken by the thread once per `detached_poll`.
    detached: Padded<Mutex<Vec<Box<dyn Pending>>>>,
    /// Set while the thread is parked with nothing to watch (no timeout):
    /// only then does a detached registration unpark it.
    parked: Padded<AtomicBool>,
    /// Set when `incoming` is non-empty or a nudge asks to spin again.
    wake: Padded<AtomicBool>,
    /// Set while the thread is parked or sleeping.
    sleeping: Padded<AtomicBool>,
    registered: Padded<AtomicU64>,
    completed: Padded<AtomicU64>,
    parks: AtomicU64,
    config: ReactorConfig,
    /// The thread's sleep (made when the thread starts).
    bell: OnceLock<Bell>,
    /// The driver waiters and the entries they watch.
    waiters: waiters::Waiters,
    waiters_alive: AtomicU64,
    waits: AtomicU64,
    asleep: AtomicU64,
}

impl Shared {
    /// Gives entries to the reactor thread to poll (whatever they are).
    fn hand_back(&self, entries: Vec<Box<dyn Pending>>) {
        lock_vec(&self.incoming).extend(entries);
        self.wake.store(true, Ordering::SeqCst);
        if let Some(b) = self.bell.get() {
            b.ring();
        }
    }
}

/// A completion reactor: a thread that completes registered [`Pending`]
/// entries. Most code uses the process-wide one, [`global`].
pub struct Reactor {
    shared: Arc<Shared>,
    thread: OnceLock<Result<(), String>>,
}

impl std::fmt::Debug for Reactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reactor")
            .field("config", &self.shared.config)
            .field("stats", &self.stats())
            .finish()
    }
}

/// The process-wide reactor. Its settings are those given to
/// [`configure`] before its first use, else the defaults overridden by the
/// environment ([`ReactorConfig::from_env`]). Its thread starts on the
/// first registration.
pub fn global() -> &'static Reactor {
    GLOBAL.get_or_init(|| {
        let pending = PENDING.lock().unwrap_or_else(|p| p.into_inner()).take();
        Reactor::new(pending.unwrap_or_else(ReactorConfig::from_env))
    })
}

static GLOBAL: OnceLock<Reactor> = OnceLock::new();
static PENDING: Mutex<Option<ReactorConfig>> = Mutex::new(None);

/// Sets the process-wide reactor's settings (the builder equivalent of the
/// `CHORUS_REACTOR_*` variables). Takes effect only before the reactor's
/// first use; returns false if it is already running with other settings.
pub fn configure(config: ReactorConfig) -> bool {
    if let Some(r) = GLOBAL.get() {
        return r.config() == config;
    }
    *PENDING.lock().unwrap_or_else(|p| p.into_inner()) = Some(config);
    true
}

impl Reactor {
    /// A reactor whose thread starts on the first registration. The thread
    /// lives as long as the process (it parks when idle).
    pub fn new(config: ReactorConfig) -> Reactor {
        Reactor {
            shared: Arc::new(Shared {
                incoming: Padded(Mutex::new(Vec::new())),
                detached: Padded(Mutex::new(Vec::new())),
                parked: Padded(AtomicBool::new(false)),
                wake: Padded(AtomicBool::new(false)),
                sleeping: Padded(AtomicBool::new(false)),
                registered: Padded(AtomicU64::new(0)),
                completed: Padded(AtomicU64::new(0)),
                parks: AtomicU64::new(0),
                config,
                bell: OnceLock::new(),
                waiters: waiters::Waiters::default(),
                waiters_alive: AtomicU64::new(0),
                waits: AtomicU64::new(0),
                asleep: AtomicU64::new(0),
            }),
            thread: OnceLock::new(),
        }
    }

    /// The reactor's settings.
    pub fn config(&self) -> ReactorConfig {
        self.shared.config
    }

    /// How long before an awaited op's expected end its future is woken
    /// now: [`prewake_lead`](ReactorConfig::prewake_lead), or longer while
    /// woken threads have been running later than it covers (see
    /// `lead.rs`); zero when the pre-wake is off.
    pub fn prewake_lead(&self) -> Duration {
        crate::lead::lead(&self.shared.config)
    }

    fn thread(&self) -> Result<(), ReactorError> {
        self.thread
            .get_or_init(|| {
                let bell = Bell::new().map_err(|e| format!("its timer: {e}"))?;
                let _ = self.shared.bell.set(bell);
                let shared = self.shared.clone();
                std::thread::Builder::new()
                    .name("chorus-reactor".into())
                    .spawn(move || run(shared))
                    .map(drop)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|reason| ReactorError { reason })
    }

    /// Ends the thread's sleep now.
    fn ring(&self) {
        if let Some(b) = self.shared.bell.get() {
            b.ring();
        }
    }

    /// Hands `entry` to the reactor thread, which polls it until it
    /// completes.
    ///
    /// # Errors
    ///
    /// If the thread cannot be started, the entry comes back with the error
    /// (the caller must then complete it another way, e.g. by a blocking
    /// wait).
    pub fn register(
        &self,
        entry: Box<dyn Pending>,
    ) -> Result<(), (ReactorError, Box<dyn Pending>)> {
        // An op a thread can sleep on goes to its stream's driver waiter.
        if let (Some(order), true) = (entry.order(), entry.sleeper().is_some()) {
            if let Err(e) = self.thread() {
                return Err((e, entry));
            }
            self.shared.registered.fetch_add(1, Ordering::Relaxed);
            if let Err(entries) = self.shared.waiters.register(&self.shared, order, entry) {
                self.shared.hand_back(entries);
            }
            return Ok(());
        }
        // An op expected to end later needs the thread only at its
        // pre-wake: a sleeping thread is then not woken before that.
        let lead = self.prewake_lead();
        let prewake = entry
            .expected_end()
            .filter(|_| !lead.is_zero())
            .and_then(|end| end.checked_sub(lead));
        self.push(&self.shared.incoming, entry)?;
        self.shared.wake.store(true, Ordering::SeqCst);
        if self.shared.sleeping.load(Ordering::SeqCst) {
            match (prewake, self.shared.bell.get()) {
                (Some(at), Some(bell)) if at > Instant::now() => bell.ring_by(at),
                _ => self.ring(),
            }
        }
        Ok(())
    }

    /// Hands a detached `entry` (nobody waits for it) to the reactor
    /// thread, which checks it once per
    /// [`detached_poll`](ReactorConfig::detached_poll) until it completes.
    /// Costs a lock and a push; the thread is woken only if it is parked.
    ///
    /// # Errors
    ///
    /// As for [`register`](Self::register).
    pub fn register_detached(
        &self,
        entry: Box<dyn Pending>,
    ) -> Result<(), (ReactorError, Box<dyn Pending>)> {
        self.push(&self.shared.detached, entry)?;
        // Pairs with the thread's `parked` store before its final check of
        // `detached`: either it sees the entry, or this sees it parked.
        if self.shared.parked.load(Ordering::SeqCst) {
            self.shared.wake.store(true, Ordering::SeqCst);
            self.ring();
        }
        Ok(())
    }

    /// Starts the thread if needed and puts `entry` in `queue`; returns the
    /// thread to wake.
    #[allow(clippy::type_complexity)]
    fn push(
        &self,
        queue: &Mutex<Vec<Box<dyn Pending>>>,
        entry: Box<dyn Pending>,
    ) -> Result<(), (ReactorError, Box<dyn Pending>)> {
        if let Err(e) = self.thread() {
            return Err((e, entry));
        }
        self.shared.registered.fetch_add(1, Ordering::Relaxed);
        lock_vec(queue).push(entry);
        Ok(())
    }

    /// Asks the thread to spin again (a future is being awaited and wants a
    /// fast wake-up). Cheap when the thread is already spinning.
    pub fn nudge(&self) {
        if !self.shared.wake.load(Ordering::Relaxed) {
            self.shared.wake.store(true, Ordering::SeqCst);
        }
        if self.shared.sleeping.load(Ordering::SeqCst) {
            self.ring();
        }
    }

    /// The reactor's counters.
    pub fn stats(&self) -> ReactorStats {
        ReactorStats {
            registered: self.shared.registered.load(Ordering::Relaxed),
            completed: self.shared.completed.load(Ordering::Relaxed),
            parks: self.shared.parks.load(Ordering::Relaxed),
            waiters: self.shared.waiters_alive.load(Ordering::Relaxed),
            waits: self.shared.waits.load(Ordering::Relaxed),
            asleep: self.shared.asleep.load(Ordering::Relaxed),
        }
    }

    /// Entries registered and not yet completed.
    pub fn pending(&self) -> u64 {
        let s = self.stats();
        s.registered.saturating_sub(s.completed)
    }
}

/// Polls one entry, leaking it if it panics (its buffers may still be in use
/// by the GPU, so dropping it would be unsound for raw-pointer users).
fn poll_one(entry: &mut Box<dyn Pending>) -> Option<bool> {
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
fn stop_for_exit() -> ! {
    loop {
        std::thread::park();
    }
}

fn run(shared: Arc<Shared>) {
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
            let mut inc = lock_vec(&shared.incoming);
            local.append(&mut inc);
            drop(inc);
            last_progress = Instant::now();
            after_long = false;
        }
        let now = Instant::now();
        if now >= next_slow {
            slow.append(&mut lock_vec(&shared.detached));
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
            let detached = !lock_vec(&shared.detached).is_empty();
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

fn lock_vec<T>(m: &Mutex<Vec<T>>) -> std::sync::MutexGuard<'_, Vec<T>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    struct Flag {
        done: Arc<AtomicBool>,
        tx: mpsc::Sender<u32>,
        id: u32,
        polls: Arc<AtomicU64>,
    }

    impl Pending for Flag {
        fn poll_complete(&mut self) -> bool {
            self.polls.fetch_add(1, Ordering::Relaxed);
            if self.done.load(Ordering::Acquire) {
                let _ = self.tx.send(self.id);
                true
            } else {
                false
            }
        }
    }

    #[test]
    fn completes_entries_in_any_order_and_parks_when_idle() {
        let r = Reactor::new(ReactorConfig {
            spin: Duration::from_micros(50),
            yield_for: Duration::from_micros(100),
            max_sleep: Duration::from_micros(200),
            ..ReactorConfig::default()
        });
        let (tx, rx) = mpsc::channel();
        let polls = Arc::new(AtomicU64::new(0));
        let flags: Vec<Arc<AtomicBool>> =
            (0..8).map(|_| Arc::new(AtomicBool::new(false))).collect();
        for (i, f) in flags.iter().enumerate() {
            r.register(Box::new(Flag {
                done: f.clone(),
                tx: tx.clone(),
                id: i as u32,
                polls: polls.clone(),
            }))
            .map_err(|(e, _)| e)
            .unwrap();
        }
        // Complete them in a scrambled order; each must come out exactly once.
        let order = [5u32, 0, 7, 2, 1, 6, 3, 4];
        for &i in &order {
            flags[i as usize].store(true, Ordering::Release);
            let got = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("entry completed");
            assert_eq!(got, i);
        }
        assert_eq!(r.stats().registered, 8);
        // The completed counter moves right after the entry returns true.
        let t0 = Instant::now();
        while r.pending() != 0 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::yield_now();
        }
        assert_eq!(r.pending(), 0);
        // Idle: the thread parks and stops polling.
        while r.stats().parks == 0 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(r.stats().parks >= 1, "idle reactor must park");
        let p = polls.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            polls.load(Ordering::Relaxed),
            p,
            "a parked reactor polls nothing"
        );
        // A new registration unparks it.
        let f = Arc::new(AtomicBool::new(true));
        r.register(Box::new(Flag {
            done: f,
            tx,
            id: 99,
            polls,
        }))
        .map_err(|(e, _)| e)
        .unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 99);
    }

    #[test]
    fn detached_entries_are_checked_slowly_and_wake_a_parked_thread() {
        let r = Reactor::new(ReactorConfig {
            spin: Duration::from_micros(50),
            yield_for: Duration::from_micros(100),
            max_sleep: Duration::from_micros(200),
            detached_poll: Duration::from_millis(5),
            ..ReactorConfig::default()
        });
        let (tx, rx) = mpsc::channel();
        let polls = Arc::new(AtomicU64::new(0));
        let flag = |id: u32, done: &Arc<AtomicBool>| {
            Box::new(Flag {
                done: done.clone(),
                tx: tx.clone(),
                id,
                polls: polls.clone(),
            })
        };
        // Start the thread and let it park with nothing to watch.
        let first = Arc::new(AtomicBool::new(true));
        r.register(flag(0, &first)).map_err(|(e, _)| e).unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 0);
        let t0 = Instant::now();
        while r.stats().parks == 0 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(r.stats().parks >= 1);
        // A detached registration wakes the parked thread.
        let d = Arc::new(AtomicBool::new(false));
        r.register_detached(flag(1, &d))
            .map_err(|(e, _)| e)
            .unwrap();
        let t0 = Instant::now();
        while polls.load(Ordering::Relaxed) < 2 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::yield_now();
        }
        // Pending and detached: checked about once per 5 ms, not spun on.
        let p0 = polls.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(100));
        let checks = polls.load(Ordering::Relaxed) - p0;
        assert!(
            (2..=60).contains(&checks),
            "{checks} checks in 100 ms at a 5 ms period"
        );
        assert_eq!(r.pending(), 1);
        d.store(true, Ordering::Release);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 1);
        // An awaited entry registered meanwhile is not held back by the
        // detached period.
        let slow = Arc::new(AtomicBool::new(false));
        r.register_detached(flag(2, &slow))
            .map_err(|(e, _)| e)
            .unwrap();
        let fast = Arc::new(AtomicBool::new(false));
        r.register(flag(3, &fast)).map_err(|(e, _)| e).unwrap();
        std::thread::sleep(Duration::from_millis(10));
        fast.store(true, Ordering::Release);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 3);
        slow.store(true, Ordering::Release);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 2);
        let t0 = Instant::now();
        while r.pending() != 0 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::yield_now();
        }
        assert_eq!(r.pending(), 0);
    }

    struct Ordered {
        pos: u64,
        done: Arc<AtomicBool>,
        polls: Arc<AtomicU64>,
        tx: mpsc::Sender<u64>,
    }

    impl Pending for Ordered {
        fn poll_complete(&mut self) -> bool {
            self.polls.fetch_add(1, Ordering::Relaxed);
            let d = self.done.load(Ordering::Acquire);
            if d {
                let _ = self.tx.send(self.pos);
            }
            d
        }
        fn order(&self) -> Option<(u64, u64)> {
            Some((7, self.pos))
        }
    }

    #[test]
    fn ordered_queue_checks_the_oldest_only_and_never_loses_one() {
        let r = Reactor::new(ReactorConfig::default());
        let (tx, rx) = mpsc::channel();
        let mk = |pos: u64| {
            let done = Arc::new(AtomicBool::new(false));
            let polls = Arc::new(AtomicU64::new(0));
            (
                Ordered {
                    pos,
                    done: done.clone(),
                    polls: polls.clone(),
                    tx: tx.clone(),
                },
                done,
                polls,
            )
        };
        // Registered out of order: 2 first, then 1 (e.g. two submitting
        // threads); 3 last.
        let (e2, d2, p2) = mk(2);
        let (e1, d1, _p1) = mk(1);
        let (e3, d3, p3) = mk(3);
        for e in [e2, e1, e3] {
            r.register(Box::new(e)).map_err(|(e, _)| e).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        // 1 is pending, so 3 (after it) is never queried; 2, registered
        // ahead of 1, is still checked (never skipped on a later position).
        assert_eq!(
            p3.load(Ordering::Relaxed),
            0,
            "entries after a pending one are skipped"
        );
        assert!(p2.load(Ordering::Relaxed) >= 1);
        // Completing 1 lets the others be checked; none is lost.
        d1.store(true, Ordering::Release);
        d2.store(true, Ordering::Release);
        d3.store(true, Ordering::Release);
        let mut got: Vec<u64> = (0..3)
            .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
            .collect();
        got.sort_unstable();
        assert_eq!(got, vec![1, 2, 3]);
    }

    struct Panicky(Arc<AtomicU64>);
    impl Pending for Panicky {
        fn poll_complete(&mut self) -> bool {
            panic!("entry bug")
        }
    }
    impl Drop for Panicky {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_panicking_entry_is_leaked_and_the_reactor_keeps_going() {
        let r = Reactor::new(ReactorConfig::default());
        let drops = Arc::new(AtomicU64::new(0));
        r.register(Box::new(Panicky(drops.clone())))
            .map_err(|(e, _)| e)
            .unwrap();
        let (tx, rx) = mpsc::channel();
        r.register(Box::new(Flag {
            done: Arc::new(AtomicBool::new(true)),
            tx,
            id: 1,
            polls: Arc::new(AtomicU64::new(0)),
        }))
        .map_err(|(e, _)| e)
        .unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 1);
        assert_eq!(drops.load(Ordering::SeqCst), 0, "never dropped");
    }

    #[test]
    fn config_defaults_spin_briefly_then_sleep_with_a_prewake() {
        let d = ReactorConfig::default();
        assert!(d.yield_for <= d.spin, "no yield phase by default");
        assert!(d.max_sleep >= Duration::from_micros(100));
        assert!(d.prewake_lead > Duration::ZERO);
    }

    /// An entry with an expected end: pre-woken once, about `lead` before
    /// it, and completed after.
    struct Expecting {
        end: Instant,
        prewoken: Arc<Mutex<Vec<Instant>>>,
        expected: Option<Instant>,
        tx: mpsc::Sender<Instant>,
    }

    impl Pending for Expecting {
        fn poll_complete(&mut self) -> bool {
            if Instant::now() < self.end {
                return false;
            }
            let _ = self.tx.send(Instant::now());
            true
        }
        fn expected_end(&self) -> Option<Instant> {
            self.expected
        }
        fn prewake(&mut self, _lead: Duration) {
            self.expected = None;
            self.prewoken.lock().unwrap().push(Instant::now());
        }
    }

    #[test]
    fn an_expected_end_gets_one_prewake_about_the_lead_before_it() {
        let lead = Duration::from_millis(5);
        let r = Reactor::new(ReactorConfig {
            prewake_lead: lead,
            ..ReactorConfig::default()
        });
        let (tx, rx) = mpsc::channel();
        let prewoken = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now();
        let end = start + Duration::from_millis(40);
        r.register(Box::new(Expecting {
            end,
            prewoken: prewoken.clone(),
            expected: Some(end),
            tx,
        }))
        .map_err(|(e, _)| e)
        .unwrap();
        let done = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(done >= end);
        let p = prewoken.lock().unwrap().clone();
        assert_eq!(p.len(), 1, "one pre-wake");
        // Not before the lead (the reactor sleeps until then), and before
        // the end (a slow CI machine may wake it late, never after the op).
        assert!(
            p[0] + Duration::from_micros(100) >= end - lead,
            "{:?} early",
            end - lead - p[0]
        );
        assert!(p[0] < done);
    }

    #[test]
    fn a_long_op_costs_few_rounds_not_a_spinning_core() {
        let r = Reactor::new(ReactorConfig::default());
        let (tx, rx) = mpsc::channel();
        let polls = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        r.register(Box::new(Flag {
            done: done.clone(),
            tx,
            id: 1,
            polls: polls.clone(),
        }))
        .map_err(|(e, _)| e)
        .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        done.store(true, Ordering::Release);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), 1);
        // Spinning would poll millions of times in 100 ms; sleeping an
        // eighth of the op's age, up to 1 ms, polls a few hundred times at
        // most (the 50 µs spin phase included).
        let n = polls.load(Ordering::Relaxed);
        assert!(n < 20_000, "{n} polls for one 100 ms op");
    }

    #[test]
    fn after_a_long_op_the_thread_parks_without_spinning() {
        // A spin phase of a minute: only the rule under test parks the
        // thread within the test's time.
        let r = Reactor::new(ReactorConfig {
            spin: Duration::from_secs(60),
            ..ReactorConfig::default()
        });
        let (tx, rx) = mpsc::channel();
        // Ends in 30 ms but is expected to end in a minute: the thread
        // sleeps towards its pre-wake instead of spinning.
        let end = Instant::now() + Duration::from_millis(30);
        r.register(Box::new(Expecting {
            end,
            prewoken: Arc::new(Mutex::new(Vec::new())),
            expected: Some(end + Duration::from_secs(60)),
            tx,
        }))
        .map_err(|(e, _)| e)
        .unwrap();
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let t0 = Instant::now();
        while r.stats().parks == 0 && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            r.stats().parks,
            1,
            "the thread did not park after a long op"
        );
    }

    /// An entry with an expected end that notes when it was first polled
    /// and when pre-woken.
    struct Foreseen {
        end: Instant,
        expected: Option<Instant>,
        first_poll: Arc<Mutex<Option<Instant>>>,
        prewoken: Arc<Mutex<Option<Instant>>>,
    }

    impl Pending for Foreseen {
        fn poll_complete(&mut self) -> bool {
            let now = Instant::now();
            self.first_poll.lock().unwrap().get_or_insert(now);
            now >= self.end
        }
        fn expected_end(&self) -> Option<Instant> {
            self.expected
        }
        fn prewake(&mut self, _lead: Duration) {
            self.expected = None;
            *self.prewoken.lock().unwrap() = Some(Instant::now());
        }
    }

    #[test]
    fn a_registration_expected_to_end_later_leaves_the_thread_asleep_until_its_prewake() {
        let lead = Duration::from_millis(5);
        // Look-ins every 8 s: the thread sleeps unless woken.
        let r = Reactor::new(ReactorConfig {
            prewake_lead: lead,
            max_sleep: Duration::from_secs(1),
            ..ReactorConfig::default()
        });
        let noted = || Arc::new(Mutex::new(None));
        // Puts the thread to sleep towards a far pre-wake.
        let far = Instant::now() + Duration::from_secs(600);
        let first = noted();
        r.register(Box::new(Foreseen {
            end: far,
            expected: Some(far),
            first_poll: first.clone(),
            prewoken: noted(),
        }))
        .map_err(|(e, _)| e)
        .unwrap();
        while first.lock().unwrap().is_none() || !r.shared.sleeping.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Registered while the thread sleeps, expected in 60 ms.
        let (polled, prewoken) = (noted(), noted());
        let end = Instant::now() + Duration::from_millis(60);
        r.register(Box::new(Foreseen {
            end,
            expected: Some(end),
            first_poll: polled.clone(),
            prewoken: prewoken.clone(),
        }))
        .map_err(|(e, _)| e)
        .unwrap();
        let t0 = Instant::now();
        while prewoken.lock().unwrap().is_none() && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let p = prewoken.lock().unwrap().expect("never pre-woken");
        let seen = polled.lock().unwrap().expect("never polled");
        // The thread first looked at the entry at its pre-wake, not at its
        // registration (without a timer to re-arm it is woken at once).
        #[cfg(target_os = "linux")]
        assert!(
            seen >= end - lead,
            "woken {:?} before the pre-wake",
            end - lead - seen
        );
        assert!(p >= seen && p < end + Duration::from_secs(10));
    }

    /// A pre-wake only entry (its op is watched elsewhere): counts its
    /// polls, notes when it gave its pre-wake.
    struct PrewakeOnly {
        expected: Option<Instant>,
        polls: Arc<AtomicU64>,
        fired: Arc<Mutex<Option<Instant>>>,
    }

    impl Pending for PrewakeOnly {
        fn poll_complete(&mut self) -> bool {
            self.polls.fetch_add(1, Ordering::Relaxed);
            self.expected.is_none()
        }
        fn expected_end(&self) -> Option<Instant> {
            self.expected
        }
        fn prewake(&mut self, _lead: Duration) {
            self.expected = None;
            *self.fired.lock().unwrap() = Some(Instant::now());
        }
        fn timer_only(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_prewake_only_entry_costs_the_thread_one_wake_up_at_its_prewake() {
        let lead = Duration::from_millis(5);
        // Look-ins every 80 ms: a 300 ms wait would see three or four.
        let r = Reactor::new(ReactorConfig {
            prewake_lead: lead,
            max_sleep: Duration::from_millis(10),
            ..ReactorConfig::default()
        });
        let polls = Arc::new(AtomicU64::new(0));
        let fired = Arc::new(Mutex::new(None));
        let end = Instant::now() + Duration::from_millis(300);
        r.register(Box::new(PrewakeOnly {
            expected: Some(end),
            polls: polls.clone(),
            fired: fired.clone(),
        }))
        .map_err(|(e, _)| e)
        .unwrap();
        let t0 = Instant::now();
        while r.pending() != 0 {
            assert!(t0.elapsed() < Duration::from_secs(10), "never completed");
            std::thread::sleep(Duration::from_millis(1));
        }
        let at = fired.lock().unwrap().expect("never pre-woken");
        assert!(
            at + Duration::from_micros(100) >= end - lead,
            "pre-woken early"
        );
        // Polled at its registration and once after its pre-wake, with no
        // look-in between.
        let n = polls.load(Ordering::Relaxed);
        assert!(n <= 3, "{n} polls");
        // Then the thread parks.
        while r.stats().parks == 0 {
            assert!(t0.elapsed() < Duration::from_secs(10), "never parked");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
