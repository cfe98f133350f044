//! Ops nobody waits for any more: taken back stream-ordered, or whose work
//! was dropped unfinished.
//!
//! What is left of such an op once its end event completes — completing
//! its work (registry entry, flight record), releasing buffers it still
//! holds, freeing its end event for reuse — is done by the threads that let
//! go of the communicator's ops, a little at each later one
//! ([`RetireQueue::push`]), not by the completion reactor. Bookkeeping
//! finished on another thread costs the enqueuing thread the cache lines
//! and memory it hands back, and the other thread's event queries slow the
//! enqueuing thread's driver calls (`nccl_bench --layers` measures both
//! ways).
//!
//! End events on one communicator stream complete in stream order, so one
//! query can tell that every older op has finished too: every
//! [`CHECK_EVERY`] pushes, one query (a few, bisecting, while the GPU is
//! behind) finds how many of the oldest ops finished, and each push
//! retires at most [`RETIRE_PER_PUSH`] of them, so no call pays for a long
//! backlog at once.
//!
//! Ops left when nobody lets go of more (the last ones of a loop) are
//! retired by a sweeper on the reactor's slow detached list: it looks only
//! when no push came during a whole detached period, so it never competes
//! with a thread that is enqueueing.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;

use super::buffer::DeviceBuffers;
use super::event_pool::EndEvent;
use super::progress::StreamProgress;
use crate::cuda::{CudaError, Device};
use crate::reactor::{self, Pending};
use chorus_core::sync::lock;

/// What a finished op's callback receives: the buffers (unless they were
/// taken early by a stream-ordered wait), or the CUDA error that ended it
/// with the buffers to release.
pub type Finished<C> = (Result<(), CudaError>, Option<C>);

/// Pushes between two looks at the end events of the queued ops.
pub(super) const CHECK_EVERY: u32 = 8;
/// Finished ops a push retires at most.
pub(super) const RETIRE_PER_PUSH: usize = 2;

/// An op nobody waits for: what runs once its end event completed.
pub(super) struct Detached<C: DeviceBuffers, F> {
    pub(super) order: (u64, u64),
    pub(super) device: Device,
    pub(super) end: Arc<EndEvent>,
    pub(super) bufs: Option<C>,
    pub(super) done: Option<F>,
}

impl<C: DeviceBuffers, F: FnOnce(Finished<C>) + Send + 'static> Pending for Detached<C, F> {
    fn order(&self) -> Option<(u64, u64)> {
        Some(self.order)
    }

    fn poll_complete(&mut self) -> bool {
        let Some(outcome) = self.end.outcome(&self.device, true) else {
            return false;
        };
        self.finish_with(outcome);
        true
    }
}

impl<C: DeviceBuffers, F: FnOnce(Finished<C>) + Send + 'static> Detached<C, F> {
    fn finish_with(&mut self, outcome: Result<(), CudaError>) {
        if let Some(done) = self.done.take() {
            done((outcome, self.bufs.take()));
        }
    }
}

/// A queued op, type-erased.
pub(super) trait Retiring: Send {
    /// The op's position on its communicator's stream (end events complete
    /// in this order; the ops of one group share one).
    fn position(&self) -> u64;
    /// Queries the end event (binding the op's device); `on_reactor`: from
    /// the reactor thread. `None` while the op runs.
    fn outcome(&self, on_reactor: bool) -> Option<Result<(), CudaError>>;
    /// Finishes the op with how it ended.
    fn finish(self: Box<Self>, outcome: Result<(), CudaError>);
}

impl<C: DeviceBuffers, F: FnOnce(Finished<C>) + Send + 'static> Retiring for Detached<C, F> {
    fn position(&self) -> u64 {
        self.order.1
    }

    fn outcome(&self, on_reactor: bool) -> Option<Result<(), CudaError>> {
        self.end.outcome(&self.device, on_reactor)
    }

    fn finish(mut self: Box<Self>, outcome: Result<(), CudaError>) {
        self.finish_with(outcome);
    }
}

/// A communicator's ops nobody waits for, oldest first: sorted by stream
/// position, whatever order their works were let go in (see the module
/// docs). Every op of the communicator holds it, so it also keeps how far
/// the stream is known to have run, for the ops that are awaited.
#[derive(Default)]
pub(crate) struct RetireQueue {
    /// How far the communicator's stream is known to have run.
    pub(super) progress: StreamProgress,
    state: Mutex<State>,
    /// Pushes so far (written under the lock, read without it): the
    /// sweeper leaves the queue alone while it moves.
    pushes: AtomicU64,
}

#[derive(Default)]
struct State {
    ops: VecDeque<Box<dyn Retiring>>,
    /// How many of the oldest ops are known to have finished.
    done: usize,
    /// Pushes so far.
    pushes: u64,
    /// Pushes since the last look at the end events.
    since_check: u32,
    /// A sweeper is registered with the reactor.
    sweeper: bool,
}

/// Ops taken out of the queue with how they ended, finished once the lock
/// is released. A push takes out at most [`RETIRE_PER_PUSH`] + 1: inline,
/// no allocation on the push path.
type Outcomes = SmallVec<[(Box<dyn Retiring>, Result<(), CudaError>); RETIRE_PER_PUSH + 2]>;

impl State {
    /// Queues `op` at its stream position. Works are usually let go of in
    /// submission order (a push at the back), but not always (two works
    /// dropped in the other order, a stream-ordered take of an older op):
    /// the queue must stay in stream order, since a finished op vouches
    /// for every op before it.
    fn insert(&mut self, op: Box<dyn Retiring>) {
        let pos = op.position();
        let at = self
            .ops
            .iter()
            .rposition(|o| o.position() <= pos)
            .map_or(0, |i| i + 1);
        // An op older than one known finished has finished too.
        if at < self.done {
            self.done += 1;
        }
        self.ops.insert(at, op);
    }

    /// Takes up to `n` ops known finished from the front.
    fn take_done(&mut self, n: usize, out: &mut Outcomes) {
        for _ in 0..n.min(self.done) {
            match self.ops.pop_front() {
                Some(op) => out.push((op, Ok(()))),
                None => break,
            }
            self.done -= 1;
        }
    }

    /// Looks at the end events to learn how many of the oldest ops have
    /// finished. The middle op first: if it finished, so did every older
    /// one (one query while the GPU keeps up). Else the finished ones are
    /// before it: bisect (the GPU is behind; a few queries). An op whose
    /// query fails at the front is taken out with its error.
    fn check(&mut self, out: &mut Outcomes) {
        self.since_check = 0;
        let mid = self.ops.len() / 2;
        // ops[..lo] finished; ops[hi..] not known to.
        let (mut lo, mut hi) = (0, mid + 1);
        let mut m = mid;
        while lo < hi && m < self.ops.len() {
            match self.ops[m].outcome(false) {
                Some(Ok(())) if m == mid => {
                    lo = mid + 1;
                    break;
                }
                Some(Ok(())) => lo = m + 1,
                None => hi = m,
                Some(Err(e)) if m == 0 => {
                    if let Some(op) = self.ops.pop_front() {
                        out.push((op, Err(e)));
                    }
                    return;
                }
                Some(Err(_)) => hi = m,
            }
            m = lo + (hi - lo) / 2;
        }
        self.done = self.done.max(lo);
    }
}

impl RetireQueue {
    /// Queues `op` and retires a few of the queued ops that have finished
    /// (on this thread). Starts a sweeper for what is left if none runs.
    pub(super) fn push(self: &Arc<Self>, op: Box<dyn Retiring>) {
        let mut out = Outcomes::new();
        let start_sweeper = {
            let mut st = lock(&self.state);
            st.insert(op);
            st.pushes += 1;
            self.pushes.store(st.pushes, Ordering::Relaxed);
            st.since_check += 1;
            if st.done == 0 && st.since_check >= CHECK_EVERY {
                st.check(&mut out);
            }
            st.take_done(RETIRE_PER_PUSH, &mut out);
            let start = !st.sweeper && !st.ops.is_empty();
            st.sweeper |= start;
            start
        };
        // Outside the lock: completing a work may wake its owner.
        for (op, outcome) in out {
            op.finish(outcome);
        }
        if start_sweeper {
            let sweeper = Sweeper {
                queue: self.clone(),
                seen: self.pushes.load(Ordering::Relaxed),
            };
            if let Err((e, mut sweeper)) = reactor::global().register_detached(Box::new(sweeper)) {
                tracing::error!(error = %e, "no completion reactor; retiring the communicator's ops inline");
                while !sweeper.poll_complete() {
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Ops queued, for tests.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        lock(&self.state).ops.len()
    }
}

/// Retires a queue's finished ops from the reactor thread once no push
/// came for a whole detached period; done when the queue is empty.
struct Sweeper {
    queue: Arc<RetireQueue>,
    seen: u64,
}

impl Pending for Sweeper {
    fn poll_complete(&mut self) -> bool {
        let pushes = self.queue.pushes.load(Ordering::Relaxed);
        if pushes != self.seen {
            // Someone is letting go of ops: they retire them.
            self.seen = pushes;
            return false;
        }
        let mut out = Outcomes::new();
        let empty = {
            let mut st = lock(&self.queue.state);
            // The newest op finished: so did every older one.
            if matches!(st.ops.back().and_then(|op| op.outcome(true)), Some(Ok(()))) {
                out.extend(st.ops.drain(..).map(|op| (op, Ok(()))));
            } else {
                while let Some(outcome) = st.ops.front().and_then(|op| op.outcome(true)) {
                    if let Some(op) = st.ops.pop_front() {
                        out.push((op, outcome));
                    }
                }
            }
            st.done = st.done.saturating_sub(out.len());
            let empty = st.ops.is_empty();
            if empty {
                st.sweeper = false;
            }
            empty
        };
        for (op, outcome) in out {
            op.finish(outcome);
        }
        empty
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::thread::ThreadId;
    use std::time::{Duration, Instant};

    /// A fake op: op `i` has finished once `upto > i` (stream order);
    /// `fail_at` makes the query of that op fail.
    struct Fake {
        i: usize,
        upto: Arc<AtomicUsize>,
        fail_at: Option<usize>,
        log: Arc<Mutex<Vec<(usize, ThreadId, bool)>>>,
    }

    impl Fake {
        fn state(&self) -> Option<Result<(), CudaError>> {
            if self.fail_at == Some(self.i) {
                return Some(Err(CudaError::Driver {
                    call: "cuEventQuery",
                    code: 700,
                    name: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
                }));
            }
            (self.upto.load(Ordering::SeqCst) > self.i).then_some(Ok(()))
        }
    }

    impl Retiring for Fake {
        fn position(&self) -> u64 {
            self.i as u64
        }
        fn outcome(&self, _on_reactor: bool) -> Option<Result<(), CudaError>> {
            self.state()
        }
        fn finish(self: Box<Self>, outcome: Result<(), CudaError>) {
            let me = std::thread::current().id();
            self.log.lock().unwrap().push((self.i, me, outcome.is_ok()));
        }
    }

    struct Setup {
        q: Arc<RetireQueue>,
        upto: Arc<AtomicUsize>,
        log: Arc<Mutex<Vec<(usize, ThreadId, bool)>>>,
    }

    impl Setup {
        fn new() -> Setup {
            Setup {
                q: Arc::default(),
                upto: Arc::default(),
                log: Arc::default(),
            }
        }
        fn push(&self, i: usize, fail_at: Option<usize>) {
            self.q.push(Box::new(Fake {
                i,
                upto: self.upto.clone(),
                fail_at,
                log: self.log.clone(),
            }));
        }
        fn wait_empty(&self) {
            let t0 = Instant::now();
            while self.q.len() > 0 {
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "the sweeper left ops queued"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    #[test]
    fn finished_ops_are_retired_in_order_by_the_pushing_thread_and_the_queue_stays_short() {
        let s = Setup::new();
        let me = std::thread::current().id();
        for i in 0..1000 {
            // Every op before this one has finished (a GPU that keeps up).
            s.upto.store(i, Ordering::SeqCst);
            s.push(i, None);
            assert!(
                s.q.len() <= 2 * CHECK_EVERY as usize + 2,
                "queue grew to {}",
                s.q.len()
            );
        }
        let log = s.log.lock().unwrap().clone();
        assert!(log.len() >= 1000 - 2 * CHECK_EVERY as usize - 2);
        assert!(log.iter().all(|e| e.2), "retired successfully");
        // The sweeper steps in only when no push came for a whole detached
        // period (a descheduled test thread); nearly all are retired here.
        let here = log.iter().filter(|e| e.1 == me).count();
        assert!(
            here >= 500,
            "{here} of {} retired by the pushing thread",
            log.len()
        );
        // The rest finishes; nobody pushes any more: the sweeper retires it.
        s.upto.store(1000, Ordering::SeqCst);
        s.wait_empty();
        let log = s.log.lock().unwrap().clone();
        assert_eq!(log.len(), 1000);
        // Each thread retires in push order; every op once.
        for t in [Some(me), None] {
            let ids: Vec<usize> = log
                .iter()
                .filter(|e| t.is_none_or(|t| e.1 == t) && (t.is_some() || e.1 != me))
                .map(|e| e.0)
                .collect();
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "out of order: {ids:?}");
        }
        let mut ids: Vec<usize> = log.iter().map(|e| e.0).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..1000).collect::<Vec<_>>());
    }

    /// Works let go of out of submission order: a later op queued first
    /// must not be retired on the word of earlier ops that finished.
    #[test]
    fn an_op_let_go_of_early_waits_for_its_own_end() {
        let s = Setup::new();
        s.push(100, None);
        // Ops 0..16 finished, op 100 still runs.
        s.upto.store(16, Ordering::SeqCst);
        for i in 0..16 {
            s.push(i, None);
        }
        std::thread::sleep(Duration::from_millis(20));
        let retired =
            |s: &Setup| -> Vec<usize> { s.log.lock().unwrap().iter().map(|e| e.0).collect() };
        assert!(
            !retired(&s).contains(&100),
            "op 100 retired while it ran: {:?}",
            retired(&s)
        );
        let t0 = Instant::now();
        while s.q.len() > 1 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "finished ops left queued"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        s.upto.store(101, Ordering::SeqCst);
        s.wait_empty();
        let mut ids = retired(&s);
        assert_eq!(ids.pop(), Some(100), "op 100 retired last");
        // An op older than the finished ones, let go of late, goes at once.
        s.upto.store(200, Ordering::SeqCst);
        for i in (120..140).rev() {
            s.push(i, None);
        }
        s.wait_empty();
        assert_eq!(s.log.lock().unwrap().len(), 37);
    }

    #[test]
    fn with_the_gpu_behind_the_queue_holds_the_backlog_and_no_more() {
        let s = Setup::new();
        let lag: usize = 300;
        for i in 0..3000usize {
            s.upto.store(i.saturating_sub(lag), Ordering::SeqCst);
            s.push(i, None);
            assert!(
                s.q.len() <= lag + 2 * CHECK_EVERY as usize + 2,
                "op {i}: {} queued with {lag} running",
                s.q.len()
            );
        }
        s.upto.store(3000, Ordering::SeqCst);
        s.wait_empty();
        assert_eq!(s.log.lock().unwrap().len(), 3000);
    }

    #[test]
    fn unfinished_ops_stay_queued_until_they_finish() {
        let s = Setup::new();
        for i in 0..100 {
            s.push(i, None);
        }
        assert_eq!(s.q.len(), 100, "nothing finished, nothing retired");
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(s.q.len(), 100, "the sweeper does not retire running ops");
        assert!(s.log.lock().unwrap().is_empty());
        // Half finished: the sweeper retires that half and keeps the rest.
        s.upto.store(50, Ordering::SeqCst);
        let t0 = Instant::now();
        while s.q.len() > 50 {
            assert!(t0.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(s.q.len(), 50);
        s.upto.store(100, Ordering::SeqCst);
        s.wait_empty();
        assert_eq!(s.log.lock().unwrap().len(), 100);
        // A later push starts a new sweeper.
        s.push(100, None);
        s.upto.store(101, Ordering::SeqCst);
        s.wait_empty();
        assert_eq!(s.log.lock().unwrap().len(), 101);
    }

    #[test]
    fn an_op_whose_event_query_fails_is_finished_with_the_error() {
        let s = Setup::new();
        for i in 0..(4 * CHECK_EVERY as usize) {
            s.push(i, Some(0));
        }
        let log = s.log.lock().unwrap().clone();
        assert_eq!(log.first().map(|e| (e.0, e.2)), Some((0, false)), "{log:?}");
        assert!(log[1..].is_empty(), "the others still run");
        s.upto.store(usize::MAX, Ordering::SeqCst);
        s.wait_empty();
        let log = s.log.lock().unwrap().clone();
        assert_eq!(log.len(), 4 * CHECK_EVERY as usize);
        assert!(log[1..].iter().all(|e| e.2));
    }
}
