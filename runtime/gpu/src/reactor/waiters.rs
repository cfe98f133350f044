//! Driver waiters: threads that sleep in the driver until an awaited op's
//! end event completes, then complete the op (docs/ARCHITECTURE.md,
//! "Waking on time").
//!
//! An entry that can be slept on ([`Pending::sleeper`]) and sits in an
//! ordered queue (a communicator's stream, [`Pending::order`]) goes to its
//! queue's waiters instead of the reactor thread. End events on one stream
//! complete in order, so a waiter sleeps on the queue's earliest pending
//! entry: when the driver wakes it, that entry and every one before it
//! have ended; it completes them (which wakes their futures), and sleeps
//! on the next. An entry registered at or after a position a waiter
//! sleeps on needs nothing more (no wake-up, no thread). One registered
//! before every such position (a future awaited out of order) gets a
//! waiter of its own, at most [`PER_QUEUE`] per queue; past that it is
//! seen when the earliest waiter wakes.
//!
//! A waiter sleeps, it never polls: it costs nothing while the op runs,
//! and it wakes once, at the op's end, however long the op ran. A waiter
//! with nothing to do parks and ends after `ReactorConfig::waiter_linger`;
//! so threads are bounded by the queues with awaited work, not by the
//! ops. A CUDA error ends a waiter's sleep: the entries' polls then find
//! it and fail their works. An abort or a timeout fails the works without
//! the waiter (their futures wake at once); the entries, which own the
//! buffers, stay until the GPU is done with them. An entry whose sleep
//! ended before its op (the driver could not sleep on it) goes to the
//! reactor thread, which polls it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use super::pending::Pending;
use super::shared::Shared;
use super::thread::{poll_one, stop_for_exit};
use super::waiter_queues::{Mailbox, Waiters};
use crate::exit_gate;
use chorus_core::sync::lock;

/// Waiters at most per queue (each sleeps on a position before the next's).
pub(crate) const PER_QUEUE: usize = 4;

impl Waiters {
    /// Hands `entry`, at `pos` of `queue`, to the queue's waiters, starting
    /// one if none will see it. Costs no wake-up when a waiter sleeps on
    /// an earlier position.
    ///
    /// # Errors
    ///
    /// When no waiter serves the queue and none could be started: the
    /// queue's entries (this one among them), for the reactor thread.
    #[allow(clippy::type_complexity)]
    pub(super) fn register(
        &self,
        shared: &Arc<Shared>,
        (queue, pos): (u64, u64),
        entry: Box<dyn Pending>,
    ) -> Result<(), Vec<Box<dyn Pending>>> {
        let mut st = self.state();
        let q = st.queues.entry(queue).or_default();
        q.entries.entry(pos).or_default().push(entry);
        if q.covers(pos) || q.waiters() >= PER_QUEUE {
            return Ok(());
        }
        q.awake += 1;
        if let Some(w) = st.idle.pop() {
            *lock(&w.queue) = Some(queue);
            drop(st);
            if let Some(t) = w.thread.get() {
                t.unpark();
            }
            return Ok(());
        }
        drop(st);
        shared.waiters_alive.fetch_add(1, Ordering::Relaxed);
        let mailbox = Arc::new(Mailbox::default());
        *lock(&mailbox.queue) = Some(queue);
        let s = shared.clone();
        let started = std::thread::Builder::new()
            .name("chorus-gpu-wait".into())
            .spawn(move || run(s, mailbox));
        if let Err(e) = started {
            shared.waiters_alive.fetch_sub(1, Ordering::Relaxed);
            tracing::error!(error = %e, "cannot start a driver waiter; the reactor thread polls its ops");
            let mut st = self.state();
            let Some(q) = st.queues.get_mut(&queue) else {
                return Ok(());
            };
            q.awake -= 1;
            if q.waiters() == 0 {
                let entries = std::mem::take(&mut q.entries);
                st.queues.remove(&queue);
                return Err(entries.into_values().flatten().collect());
            }
        }
        Ok(())
    }
}

/// A waiter's life: serves the queue it was started for, then each queue
/// it is given, parking in between; ends after lingering idle.
fn run(shared: Arc<Shared>, me: Arc<Mailbox>) {
    let _ = me.thread.set(std::thread::current());
    // The driver was used before the first op was registered: the exit
    // handler registered now runs before the driver's own.
    exit_gate::install();
    let linger = shared.config.waiter_linger;
    while let Some(queue) = me.take().or_else(|| next_queue(&shared, &me, linger)) {
        serve(&shared, queue);
        shared.waiters.state().idle.push(me.clone());
    }
    shared.waiters_alive.fetch_sub(1, Ordering::Relaxed);
    match exit_gate::enter() {
        Some(_inside) => crate::cuda::release_side_streams(true),
        // Exiting: the driver may be gone; leave them be.
        None => crate::cuda::release_side_streams(false),
    }
}

/// Parks an idle waiter until it is given a queue; `None` once it lingered
/// `linger` with none (it has then left the idle list).
fn next_queue(shared: &Shared, me: &Arc<Mailbox>, linger: std::time::Duration) -> Option<u64> {
    let since = Instant::now();
    loop {
        if let Some(q) = me.take() {
            return Some(q);
        }
        let left = linger.saturating_sub(since.elapsed());
        if left.is_zero() {
            let mut st = shared.waiters.state();
            if let Some(q) = me.take() {
                return Some(q);
            }
            st.idle.retain(|w| !Arc::ptr_eq(w, me));
            return None;
        }
        std::thread::park_timeout(left);
    }
}

/// Serves `queue` until its entries are done or another waiter sleeps on
/// an earlier position: sleeps on the earliest entry, completes what
/// ended, again.
fn serve(shared: &Shared, queue: u64) {
    loop {
        let (pos, sleeper) = {
            let mut st = shared.waiters.state();
            let Some(q) = st.queues.get_mut(&queue) else {
                return;
            };
            let low = q.entries.first_key_value().map(|(&pos, list)| {
                let sleeper = list.iter().find_map(|e| e.sleeper());
                (pos, sleeper)
            });
            q.awake -= 1;
            match low {
                Some((pos, sleeper)) if !q.asleep.iter().any(|&s| s <= pos) => {
                    q.asleep.push(pos);
                    (pos, sleeper)
                }
                // Nothing left, or another waiter sleeps on it already.
                _ => {
                    if q.is_unused() {
                        st.queues.remove(&queue);
                    }
                    return;
                }
            }
        };
        {
            let Some(_inside) = exit_gate::enter() else {
                stop_for_exit();
            };
            if let Some(s) = &sleeper {
                shared.asleep.fetch_add(1, Ordering::Relaxed);
                if s.sleep_until_end() {
                    shared.waits.fetch_add(1, Ordering::Relaxed);
                }
                shared.asleep.fetch_sub(1, Ordering::Relaxed);
            }
        }
        // That entry has ended, and every one before it on the stream.
        let ended = {
            let mut st = shared.waiters.state();
            let Some(q) = st.queues.get_mut(&queue) else {
                return;
            };
            if let Some(i) = q.asleep.iter().position(|&s| s == pos) {
                q.asleep.swap_remove(i);
            }
            q.awake += 1;
            let later = q.entries.split_off(&(pos + 1));
            std::mem::replace(&mut q.entries, later)
        };
        complete(shared, ended);
    }
}

/// Completes the entries of a stream that ended; hands those still running
/// to the reactor thread.
fn complete(shared: &Shared, ended: BTreeMap<u64, Vec<Box<dyn Pending>>>) {
    let mut running = Vec::new();
    {
        let Some(_inside) = exit_gate::enter() else {
            stop_for_exit();
        };
        for mut e in ended.into_values().flatten() {
            match poll_one(&mut e) {
                Some(true) => {
                    shared.completed.fetch_add(1, Ordering::Relaxed);
                }
                Some(false) => running.push(e),
                None => {
                    tracing::error!("a completion entry panicked; its buffers are leaked");
                    std::mem::forget(e);
                    shared.completed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    if !running.is_empty() {
        // The driver could not sleep on it (its sleep ended before the op
        // did): the reactor thread polls it.
        shared.hand_back(running);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{mpsc, Arc, Condvar, Mutex};
    use std::time::{Duration, Instant};

    use super::super::handle::Reactor;
    use super::super::pending::{Pending, Sleeper};
    use super::PER_QUEUE;
    use crate::config::ReactorConfig;

    /// A stream whose ops end in order, up to a position the test moves;
    /// or fail all at once.
    #[derive(Default)]
    struct FakeStream {
        state: Mutex<(u64, bool)>,
        cv: Condvar,
        /// Sleeps that were cut short (the driver could not sleep).
        short: AtomicBool,
        sleeps: AtomicU64,
    }

    impl FakeStream {
        fn end_through(&self, pos: u64) {
            let mut g = self.state.lock().unwrap();
            g.0 = g.0.max(pos);
            self.cv.notify_all();
        }
        fn fail(&self) {
            self.state.lock().unwrap().1 = true;
            self.cv.notify_all();
        }
        /// `Some(failed)` once op `pos` ended or failed.
        fn outcome(&self, pos: u64) -> Option<bool> {
            let g = self.state.lock().unwrap();
            (g.1 || g.0 >= pos).then_some(g.1)
        }
    }

    struct OpSleeper(Arc<FakeStream>, u64);

    impl Sleeper for OpSleeper {
        fn sleep_until_end(&self) -> bool {
            if self.0.outcome(self.1).is_some() {
                return false;
            }
            self.0.sleeps.fetch_add(1, Ordering::Relaxed);
            if self.0.short.load(Ordering::Relaxed) {
                return false;
            }
            let g = self.0.state.lock().unwrap();
            let _g = self.0.cv.wait_while(g, |s| !s.1 && s.0 < self.1).unwrap();
            true
        }
    }

    /// An awaited op at `pos` of its stream: sends `(pos, failed)` when it
    /// completes; counts its polls; notes when it is dropped.
    struct Op {
        stream: Arc<FakeStream>,
        queue: u64,
        pos: u64,
        tx: mpsc::Sender<(u64, bool)>,
        polls: Arc<AtomicU64>,
        dropped: Arc<AtomicBool>,
    }

    impl Pending for Op {
        fn poll_complete(&mut self) -> bool {
            self.polls.fetch_add(1, Ordering::Relaxed);
            match self.stream.outcome(self.pos) {
                Some(failed) => {
                    let _ = self.tx.send((self.pos, failed));
                    true
                }
                None => false,
            }
        }
        fn order(&self) -> Option<(u64, u64)> {
            Some((self.queue, self.pos))
        }
        fn sleeper(&self) -> Option<Arc<dyn Sleeper>> {
            Some(Arc::new(OpSleeper(self.stream.clone(), self.pos)))
        }
    }

    impl Drop for Op {
        fn drop(&mut self) {
            self.dropped.store(true, Ordering::SeqCst);
        }
    }

    struct Rig {
        r: Reactor,
        stream: Arc<FakeStream>,
        tx: mpsc::Sender<(u64, bool)>,
        rx: mpsc::Receiver<(u64, bool)>,
        polls: Arc<AtomicU64>,
    }

    impl Rig {
        fn new(config: ReactorConfig) -> Rig {
            let (tx, rx) = mpsc::channel();
            Rig {
                r: Reactor::new(config),
                stream: Arc::new(FakeStream::default()),
                tx,
                rx,
                polls: Arc::new(AtomicU64::new(0)),
            }
        }

        /// Registers the op at `pos` of queue 1; its drop flag.
        fn op(&self, pos: u64) -> Arc<AtomicBool> {
            let dropped = Arc::new(AtomicBool::new(false));
            self.r
                .register(Box::new(Op {
                    stream: self.stream.clone(),
                    queue: 1,
                    pos,
                    tx: self.tx.clone(),
                    polls: self.polls.clone(),
                    dropped: dropped.clone(),
                }))
                .map_err(|(e, _)| e)
                .unwrap();
            dropped
        }

        fn next(&self) -> (u64, bool) {
            self.rx.recv_timeout(Duration::from_secs(10)).unwrap()
        }

        /// Waits until `f` holds of the reactor (10 s at most).
        fn until(&self, what: &str, f: impl Fn(&Reactor) -> bool) {
            let t0 = Instant::now();
            while !f(&self.r) {
                assert!(t0.elapsed() < Duration::from_secs(10), "never: {what}");
                std::thread::sleep(Duration::from_millis(1));
            }
        }

        fn asleep_on(&self, n: u64) {
            let t0 = Instant::now();
            while self.stream.sleeps.load(Ordering::Relaxed) < n {
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "{} sleeps, not {n}: {:?}",
                    self.stream.sleeps.load(Ordering::Relaxed),
                    self.r.stats()
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            // In the wait itself, not just counted.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn an_awaited_op_is_completed_by_a_waiter_asleep_until_its_end() {
        let rig = Rig::new(ReactorConfig::default());
        let dropped = rig.op(1);
        rig.asleep_on(1);
        // Asleep, not polling: no poll while the op runs, and the entry
        // (its buffers) is kept.
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(rig.polls.load(Ordering::Relaxed), 0, "polled while asleep");
        assert!(!dropped.load(Ordering::SeqCst), "dropped before its end");
        assert!(rig.rx.try_recv().is_err());
        rig.stream.end_through(1);
        assert_eq!(rig.next(), (1, false));
        rig.until("completed", |r| r.pending() == 0);
        assert!(dropped.load(Ordering::SeqCst));
        let s = rig.r.stats();
        assert_eq!((s.waiters, s.waits), (1, 1), "{s:?}");
        assert_eq!(rig.polls.load(Ordering::Relaxed), 1, "one poll, at the end");
        // The reactor thread never had the entry: it parked.
        assert_eq!(s.completed, 1);
    }

    #[test]
    fn a_stream_of_awaited_ops_costs_one_waiter_that_sleeps_once_per_end() {
        let rig = Rig::new(ReactorConfig::default());
        for pos in 1..=8 {
            rig.op(pos);
        }
        rig.asleep_on(1);
        for pos in 1..=8 {
            rig.stream.end_through(pos);
            assert_eq!(rig.next(), (pos, false), "in order");
        }
        rig.until("completed", |r| r.pending() == 0);
        let s = rig.r.stats();
        assert_eq!(s.waiters, 1, "{s:?}");
        assert!(s.waits <= 8, "{s:?}");
        // Ops that ended together cost one sleep.
        for pos in 9..=16 {
            rig.op(pos);
        }
        rig.asleep_on(s.waits + 1);
        let before = rig.r.stats().waits;
        rig.stream.end_through(16);
        let mut got: Vec<u64> = (9..=16).map(|_| rig.next().0).collect();
        got.sort_unstable();
        assert_eq!(got, (9..=16).collect::<Vec<_>>());
        rig.until("completed", |r| r.pending() == 0);
        assert!(rig.r.stats().waits <= before + 1, "{:?}", rig.r.stats());
    }

    #[test]
    fn an_op_awaited_before_the_one_a_waiter_sleeps_on_gets_its_own_waiter_up_to_the_cap() {
        let rig = Rig::new(ReactorConfig::default());
        rig.op(100);
        rig.asleep_on(1);
        // Earlier on the stream: it ends first, and is seen then, not when
        // 100 ends.
        rig.op(50);
        rig.asleep_on(2);
        assert_eq!(rig.r.stats().waiters, 2);
        rig.stream.end_through(50);
        assert_eq!(rig.next(), (50, false));
        assert!(rig.rx.recv_timeout(Duration::from_millis(50)).is_err());
        // Ever earlier ones, each awaited while the others sleep: a waiter
        // each, up to the cap; past it, they wait for the earliest.
        let earlier = [90, 80, 70, 60, 55];
        for (i, pos) in earlier.into_iter().enumerate() {
            rig.op(pos);
            if i + 2 <= PER_QUEUE {
                rig.asleep_on(3 + i as u64);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(rig.r.stats().waiters, PER_QUEUE as u64);
        rig.stream.end_through(90);
        let mut got: Vec<u64> = (0..earlier.len()).map(|_| rig.next().0).collect();
        got.sort_unstable();
        assert_eq!(got, vec![55, 60, 70, 80, 90]);
        rig.stream.end_through(100);
        assert_eq!(rig.next(), (100, false));
        rig.until("completed", |r| r.pending() == 0);
    }

    #[test]
    fn a_failure_ends_the_sleep_and_fails_every_op_of_the_stream() {
        let rig = Rig::new(ReactorConfig::default());
        let flags: Vec<_> = (1..=5).map(|pos| rig.op(pos)).collect();
        rig.asleep_on(1);
        rig.stream.fail();
        let mut got: Vec<(u64, bool)> = (0..5).map(|_| rig.next()).collect();
        got.sort_unstable();
        assert_eq!(got, (1..=5).map(|p| (p, true)).collect::<Vec<_>>());
        rig.until("completed", |r| r.pending() == 0);
        assert!(flags.iter().all(|f| f.load(Ordering::SeqCst)));
    }

    #[test]
    fn an_op_the_driver_cannot_sleep_on_goes_to_the_reactor_thread() {
        let rig = Rig::new(ReactorConfig::default());
        rig.stream.short.store(true, Ordering::Relaxed);
        let dropped = rig.op(1);
        rig.asleep_on(1);
        // Polled by the reactor thread meanwhile, never dropped early.
        std::thread::sleep(Duration::from_millis(30));
        assert!(!dropped.load(Ordering::SeqCst));
        assert!(rig.polls.load(Ordering::Relaxed) >= 2);
        rig.stream.end_through(1);
        assert_eq!(rig.next(), (1, false));
        rig.until("completed", |r| r.pending() == 0);
        assert!(dropped.load(Ordering::SeqCst));
    }

    #[test]
    fn idle_waiters_end_after_lingering_and_a_new_op_starts_one() {
        let rig = Rig::new(ReactorConfig {
            waiter_linger: Duration::from_millis(50),
            ..ReactorConfig::default()
        });
        for round in 0..3 {
            rig.op(round * 2 + 1);
            rig.op(round * 2 + 2);
            rig.asleep_on(round + 1);
            assert_eq!(rig.r.stats().waiters, 1, "round {round}");
            rig.stream.end_through(round * 2 + 2);
            rig.next();
            rig.next();
            rig.until("no waiter left", |r| r.stats().waiters == 0);
        }
    }

    #[test]
    fn ops_of_other_streams_have_waiters_of_their_own() {
        let rig = Rig::new(ReactorConfig::default());
        let other = Arc::new(FakeStream::default());
        rig.op(5);
        rig.r
            .register(Box::new(Op {
                stream: other.clone(),
                queue: 2,
                pos: 1,
                tx: rig.tx.clone(),
                polls: rig.polls.clone(),
                dropped: Arc::new(AtomicBool::new(false)),
            }))
            .map_err(|(e, _)| e)
            .unwrap();
        rig.until("two waiters", |r| r.stats().waiters == 2);
        // The other stream's op ends first, and is seen then.
        other.end_through(1);
        assert_eq!(rig.next(), (1, false));
        rig.stream.end_through(5);
        assert_eq!(rig.next(), (5, false));
        rig.until("completed", |r| r.pending() == 0);
    }
}
