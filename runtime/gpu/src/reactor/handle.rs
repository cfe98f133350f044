//! [`Reactor`], the handle through which ops are registered, with its
//! counters ([`ReactorStats`]) and the error of a thread that cannot start
//! ([`ReactorError`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::pending::Pending;
use super::shared::{Padded, Shared};
use super::thread::run;
use super::waiter_queues::Waiters;
use crate::bell::Bell;
use crate::config::ReactorConfig;
use chorus_core::sync::lock;

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

impl ReactorStats {
    /// Entries registered and not yet completed.
    pub fn pending(&self) -> u64 {
        self.registered.saturating_sub(self.completed)
    }
}

/// The reactor could not start its thread.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the chorus completion reactor thread: {reason}")]
pub struct ReactorError {
    /// The OS error text.
    pub reason: String,
}

/// A completion reactor: a thread that completes registered [`Pending`]
/// entries. Most code uses the process-wide one, [`global`](super::global).
pub struct Reactor {
    pub(super) shared: Arc<Shared>,
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
                waiters: Waiters::default(),
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
        lock(queue).push(entry);
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
        self.stats().pending()
    }
}
