//! Ops run on the caller's own thread: the worker and the readers are
//! [`Relay`]s, which the submitting thread and the awaiting caller may
//! poll in the stead of their host tasks on chorus's I/O threads.
//!
//! * **Submit.** A small op that finds the worker waiting for work is
//!   handed to it with the worker claimed (the queue's wake-up goes to the
//!   claim, not to the I/O thread), and the worker is polled once on the
//!   submitting thread: the op's first frames leave from there, at once.
//! * **Await.** The first poll of a small op's work that finds it pending
//!   claims the worker and the readers and polls them in turn — the
//!   readers read the sockets themselves (see `halves`), the worker takes
//!   their frames and completes the op — until the op is done or no frame
//!   was sent or received for [`TcpOptions::caller_spin`] (a caller whose
//!   op keeps moving keeps driving it), outside tokio's cooperative
//!   budget ([`unbudgeted`]). Then it lets go: whatever it did not finish,
//!   the host tasks take over (the claims hand them any wake-up they did
//!   not serve), so a caller that stops polling stops nothing. A caller
//!   whose op is done leaves the pipes watched (see `linger`).
//! * **Large ops where ranks outnumber cores.** There the I/O threads that
//!   would run a large op share the cores with the callers anyway, and
//!   every hand-off between them can leave a core idle while a thread
//!   wakes up: an awaiting caller drives a large op too ([`LargeOp`]),
//!   with the patience of [`LARGE_OP_PATIENCE`] (or the spin, if longer).
//!   Elsewhere large ops stay on the I/O threads, and the caller's thread
//!   stays free for its other tasks.
//!
//! A round trip then wakes no thread at all when both ranks' callers are
//! at the op together; the cost is up to `caller_spin` of the caller's
//! core per op when a peer comes late. Where this host's ranks outnumber
//! its cores, the spinning caller yields its core after every look
//! (`sched_yield`), so a peer that shares the core runs at once, as MPI's
//! polling progress does when oversubscribed; elsewhere it yields every
//! [`YIELD_EVERY`] looks, for an I/O thread or another program. Where
//! they outnumber them more than [`SPIN_MAX_RANKS_PER_CORE`] times, the
//! default spin is off.
//!
//! docs/ARCHITECTURE.md, "A small TCP op without hand-offs", tells the
//! whole path.

use std::fmt;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use chorus_core::relay::{Claim, Relay, Step};
use smallvec::SmallVec;
use tokio::runtime::Handle;

use super::halves;
use super::state::Inner;
use crate::work::Assist;
use chorus_core::sync::lock;

/// Spinning rounds between yields where every local rank has a core.
const YIELD_EVERY: u32 = 32;

/// Spinning rounds between looks at the clock.
const CLOCK_EVERY: u32 = 8;

/// Where this host's ranks outnumber its cores more than this many times,
/// the default caller spin is off: the spinning callers then take the
/// cores their peers need (4-byte all_reduce on 2 cores, back to back: at
/// 16 ranks spinning is 1.3× faster, at 32 about even, at 64 and 256 it
/// is 1.6–1.7× slower; `benches/RESULTS.md`).
const SPIN_MAX_RANKS_PER_CORE: usize = 16;

/// How long a caller that drives a large op where ranks outnumber cores
/// waits for the op to move before it lets go: a few scheduler slices
/// (0.75 ms each by default on Linux), as a peer that runs this op may
/// wait that long for a core. 4 ranks on 2 cores, 16 MiB all_reduce: a
/// driving caller's longest wait between two frames is 1.0–3.6 ms for
/// 80 % of ops, 2.1 ms for the median one (`benches/RESULTS.md`).
pub(super) const LARGE_OP_PATIENCE: Duration = Duration::from_millis(2);

/// The caller's way into a group's worker and readers.
pub(super) struct Driver {
    inner: Arc<Inner>,
    worker: Arc<Relay>,
    handle: Handle,
    /// How long an awaiting caller drives a small op itself.
    spin: Duration,
    /// Spinning rounds between yields of the core: 0 (every round) where
    /// this host's ranks outnumber its cores.
    yield_every: u32,
    /// This host's ranks outnumber its cores (see [`LargeOp`]).
    crowded: bool,
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver").field("spin", &self.spin).finish()
    }
}

/// Hosts `relay` on the I/O runtime: polls it whenever it is woken and no
/// caller is polling it, until its future ends.
pub(super) fn host(handle: &Handle, relay: &Arc<Relay>) {
    let r = relay.clone();
    handle.spawn(std::future::poll_fn(move |cx| r.poll_host(cx)));
}

impl Driver {
    pub(super) fn new(
        inner: Arc<Inner>,
        worker: Arc<Relay>,
        handle: Handle,
        spin: Duration,
    ) -> Driver {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let local = chorus_store::rt::local_ranks().unwrap_or(1);
        let crowded = local > cores;
        let too_crowded = local > SPIN_MAX_RANKS_PER_CORE * cores;
        let spin = if inner.opts.caller_spin.is_none() && too_crowded {
            Duration::ZERO
        } else {
            spin
        };
        Driver {
            inner,
            worker,
            handle,
            spin,
            yield_every: if crowded { 0 } else { YIELD_EVERY },
            crowded,
        }
    }

    /// Whether an op of `bytes` runs on the caller's thread.
    pub(super) fn is_small(&self, bytes: usize) -> bool {
        bytes <= self.inner.opts.crossover_bytes
    }

    /// Whether awaiting callers drive small ops.
    pub(super) fn spins(&self) -> bool {
        !self.spin.is_zero()
    }

    /// Whether awaiting callers drive large ops too ([`LargeOp`]).
    pub(super) fn drives_large(&self) -> bool {
        self.crowded && self.spins()
    }

    /// Claims the worker before a small op is queued, if the worker waits
    /// for work and no one else holds it; then [`kick`](Self::kick) it
    /// once the op is queued.
    pub(super) fn claim_idle_worker(&self) -> Option<Claim<'_>> {
        if !self.inner.linger.is_idle() || chorus_store::rt::on_io_thread() {
            return None;
        }
        self.worker.claim()
    }

    /// Polls the claimed worker once, which takes the queued op and sends
    /// what it can; the claim's drop hands anything left to the host.
    pub(super) fn kick(&self, claim: Claim<'_>) {
        let _rt = self.handle.enter();
        unbudgeted(|| {
            claim.poll();
        });
    }
}

/// Runs `f` outside tokio's cooperative budget. A caller polls the relays
/// round after round within one poll of its own task: past the budget,
/// every tokio resource they touch would answer pending and defer its
/// wake-up to the caller's runtime, which hands it to the host task (an
/// I/O thread's wake-up, and the host then runs the next op) when the
/// caller parks.
pub(super) fn unbudgeted(f: impl FnOnce()) {
    let mut f = Some(f);
    let once = std::pin::pin!(tokio::task::unconstrained(std::future::poll_fn(|_| {
        if let Some(f) = f.take() {
            f();
        }
        Poll::Ready(())
    })));
    let _ = once.poll(&mut Context::from_waker(std::task::Waker::noop()));
}

impl Assist for Driver {
    fn assist(&self, done: &dyn Fn() -> bool, deadline: Option<Instant>) {
        self.assist_for(self.spin, done, deadline);
    }
}

/// A large op's driver where this host's ranks outnumber its cores: the
/// awaiting caller drives it until nothing moved for
/// [`LARGE_OP_PATIENCE`] (see the module docs).
#[derive(Debug)]
pub(super) struct LargeOp(pub(super) Arc<Driver>);

impl Assist for LargeOp {
    fn assist(&self, done: &dyn Fn() -> bool, deadline: Option<Instant>) {
        self.0
            .assist_for(self.0.spin.max(LARGE_OP_PATIENCE), done, deadline);
    }
}

impl Driver {
    /// Drives the op until `done`, until nothing moved for `patience` or
    /// until `deadline`.
    fn assist_for(&self, patience: Duration, done: &dyn Fn() -> bool, deadline: Option<Instant>) {
        if self.spin.is_zero() || chorus_store::rt::on_io_thread() {
            return;
        }
        let Some(worker) = self.worker.claim() else {
            return;
        };
        // The readers of the connections made so far (more may come while
        // this op runs: their host tasks serve them).
        let relays: SmallVec<[Arc<Relay>; 8]> = lock(&self.inner.readers).iter().cloned().collect();
        let readers: SmallVec<[Claim<'_>; 8]> = relays.iter().filter_map(|r| r.claim()).collect();
        let rt = self.handle.enter();
        unbudgeted(|| self.drive(&worker, &readers, patience, done, deadline));
        drop(rt);
        drop(readers);
        drop(worker);
    }

    /// The caller's rounds over the claimed worker and readers (see the
    /// module docs), until the op is done, no frame moved for `patience`
    /// or `deadline` passed.
    fn drive(
        &self,
        worker: &Claim<'_>,
        readers: &[Claim<'_>],
        patience: Duration,
        done: &dyn Fn() -> bool,
        deadline: Option<Instant>,
    ) {
        let mut moved = self.inner.moved.load(Ordering::Relaxed);
        let mut since = Instant::now();
        let mut rounds = 0u32;
        let round = || {
            for r in readers {
                r.poll();
            }
            worker.poll()
        };
        halves::while_spinning(|| loop {
            // The clock only every few rounds: reading it costs as much
            // as a round's look at an empty pipe.
            if round() == Step::Finished || done() {
                break;
            }
            if rounds % CLOCK_EVERY == 0 {
                let clock = Instant::now();
                let now = self.inner.moved.load(Ordering::Relaxed);
                if now != moved {
                    moved = now;
                    since = clock;
                } else if clock.duration_since(since) >= patience {
                    break;
                }
                if deadline.is_some_and(|d| clock >= d) {
                    break;
                }
            }
            // Let a thread this core owes time to run (a peer rank's
            // caller, an I/O thread, another program): a pure spin holds
            // the core a peer may need for a whole scheduler slice. Where
            // every rank has a core, only now and then: a yield is a
            // system call, and the peer's frame comes sooner than that.
            rounds += 1;
            if self.yield_every == 0 || rounds % self.yield_every == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        });
        // One more round, not spinning: the sockets go back to the I/O
        // driver with their wakers registered, for the host tasks. With the
        // op done, the pipes stay watched while the worker waits for work
        // (see `linger`).
        if done() {
            halves::while_lingering(round);
            if !self.inner.mark_lingering().keep {
                round();
            }
        } else {
            round();
        }
    }
}
