//! Small ops on the group's shared-memory board (see `board`): each rank
//! writes its part once, with the op's signature, and arrives; when the
//! last rank arrives, every rank reads what it needs. No frame is
//! exchanged, so no rank wakes another for each round: one write and
//! `n − 1` reads per rank for an all_reduce, where recursive doubling
//! takes `log₂ n` dependent rounds of messages.
//!
//! * **Checks.** Every rank compares every other rank's signature with its
//!   own once all arrived, so ranks that called different ops (or the same
//!   with different counts, dtypes, reductions or roots) all fail with the
//!   mismatch. While it waits, the worker looks at every connected peer's
//!   frames as usual: a rank that called an op which does not run on the
//!   board (a larger one) and sent frames is found the same way.
//! * **A dead peer.** Every 100 ms of waiting, the board's watcher thread
//!   looks whether the processes of the ranks that have not arrived still
//!   exist: a rank that died before it arrived fails the op with
//!   [`WorkError::PeerLost`] naming it. Otherwise the group's liveness and
//!   the op's timeout bound the wait, as for frames.
//! * **Results.** A reduction reads the ranks' parts in rank order, so
//!   every rank gets the same bits (those of the serial reference).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;

use chorus_core::board::{parity, Arrival};
use chorus_core::{HostBuffer, OpContext, ReduceOp, WorkError};

use super::super::board::{self, BoardState, Shared};
use super::super::shm_board::BOARD_BYTES;
use super::super::watching::same_op;
use super::super::wire::{mismatch_detail, Sig};
use super::super::worker::{Active, Worker};
use super::choose::DIRECT_MAX_RANKS;
use super::exec::combine_bytes;
use crate::reduce::finish_avg;

/// One board op's view of the board once every rank arrived.
struct Posted {
    shared: Arc<Shared>,
    parity: usize,
}

impl Posted {
    /// What `rank` wrote for op `ctx`, which must be `len` bytes (its
    /// signature matched, so only a broken peer wrote other lengths).
    fn part(&self, rank: usize, len: usize, ctx: &OpContext) -> Result<&[u8], WorkError> {
        let part = self.shared.map.get(rank, self.parity).1;
        if part.len() != len {
            return Err(WorkError::Backend {
                ctx: ctx.clone(),
                msg: format!(
                    "rank {rank} wrote {} bytes on the group's shared-memory board where {len} were due; its memory may be corrupt",
                    part.len()
                ),
            });
        }
        Ok(part)
    }

    /// Reduces every rank's part in rank order into `buf`.
    fn reduce_into(
        &self,
        n: usize,
        op: ReduceOp,
        buf: &mut HostBuffer,
        ctx: &OpContext,
    ) -> Result<(), WorkError> {
        let (dtype, count) = (buf.dtype(), buf.len());
        let dst = buf.as_bytes_mut();
        let len = dst.len();
        dst.copy_from_slice(self.part(0, len, ctx)?);
        for r in 1..n {
            combine_bytes(op, dtype, dst, self.part(r, len, ctx)?);
        }
        finish_avg(op, buf, 0..count, n);
        Ok(())
    }
}

impl Worker {
    /// Sets up the group's board at its first collective (see `board`).
    ///
    /// # Errors
    ///
    /// [`WorkError::Store`] when the store fails or a rank does not take
    /// part within the connect timeout.
    pub(in super::super) async fn ensure_board(
        &mut self,
        ctx: &OpContext,
    ) -> Result<(), WorkError> {
        if !matches!(self.board, BoardState::Unknown) {
            return Ok(());
        }
        if self.n() <= DIRECT_MAX_RANKS {
            self.board = BoardState::Off;
            return Ok(());
        }
        // A rank that does not offer shared memory still votes (against).
        let opts = &self.inner.opts;
        let offer = opts.shared_memory && opts.local_unix_sockets;
        let timeout = opts.connect_timeout;
        let store = self.dialer.store.clone();
        let runner = self.inner.runner.get().cloned();
        match board::set_up(&*store, self.n(), self.me(), offer, timeout, runner).await {
            Ok(Some(b)) => self.board = BoardState::On(b),
            Ok(None) => self.board = BoardState::Off,
            Err(board::SetupFailed::Store(cause)) => {
                return Err(WorkError::Store {
                    ctx: ctx.clone(),
                    cause: format!(
                        "{cause}; every rank of the group sets it up at its first collective: check that all ranks called the same one"
                    ),
                })
            }
            Err(board::SetupFailed::Other(msg)) => {
                return Err(WorkError::Backend {
                    ctx: ctx.clone(),
                    msg,
                })
            }
        }
        Ok(())
    }

    /// Whether an op whose largest part on one rank is `bytes` runs on the
    /// board: a small op (below `crossover_bytes`) that fits its areas.
    pub(super) fn on_board(&self, bytes: usize) -> bool {
        matches!(self.board, BoardState::On(_))
            && bytes <= BOARD_BYTES
            && bytes < self.inner.opts.crossover_bytes
    }

    /// One board op: writes `payload` with `o`'s signature, arrives, waits
    /// for every rank and checks every rank's signature.
    async fn post(&mut self, o: &Active<'_>, payload: &[u8]) -> Result<Posted, WorkError> {
        let (n, me) = (self.n(), self.me());
        let BoardState::On(b) = &mut self.board else {
            return Err(WorkError::Backend {
                ctx: o.ctx.clone(),
                msg: "a board op without a board (a chorus bug)".into(),
            });
        };
        let (k, shared) = (b.take_next(), b.shared());
        let p = parity(k);
        shared.map.put(me, p, &o.sig.to_board(), payload);
        shared.map.stamp(me, p).store(k + 1, Ordering::Release);
        if shared.board().arrive(k) == (Arrival::Last { wake: true }) {
            shared.map.wake_done();
        }
        if !shared.board().is_done(k) {
            let s = &shared;
            self.wait_watching_all(o, &mut |cx| {
                if s.board().is_done(k) {
                    return Poll::Ready(Ok(()));
                }
                if let Some((peer, pid)) = s.dead() {
                    return Poll::Ready(Err(WorkError::PeerLost {
                        ctx: o.ctx.clone(),
                        peer,
                        cause: format!(
                            "its process (pid {pid}) ended before it reached this op on the group's shared-memory board"
                        ),
                    }));
                }
                s.wake_when_done(k, cx.waker());
                if s.board().is_done(k) {
                    return Poll::Ready(Ok(()));
                }
                Poll::Pending
            })
            .await?;
        }
        for r in (0..n).filter(|&r| r != me) {
            let theirs = Sig::from_board(&shared.map.get(r, p).0);
            if !same_op(&theirs, &o.sig) {
                return Err(WorkError::Mismatch {
                    ctx: o.ctx.clone(),
                    detail: mismatch_detail(r, &theirs, me, &o.sig, o.ctx.op),
                });
            }
        }
        Ok(Posted { shared, parity: p })
    }

    /// The all_reduce of `buf` on the board: every rank reduces every
    /// rank's part in rank order.
    pub(super) async fn all_reduce_board(
        &mut self,
        o: &Active<'_>,
        buf: &mut HostBuffer,
        op: ReduceOp,
    ) -> Result<(), WorkError> {
        let posted = self.post(o, buf.as_bytes()).await?;
        posted.reduce_into(self.n(), op, buf, o.ctx)
    }

    /// The reduce of `buf` to `root` on the board: the root reduces every
    /// rank's part in rank order.
    pub(super) async fn reduce_board(
        &mut self,
        o: &Active<'_>,
        buf: &mut HostBuffer,
        root: usize,
        op: ReduceOp,
    ) -> Result<(), WorkError> {
        let posted = self.post(o, buf.as_bytes()).await?;
        if self.me() != root {
            return Ok(());
        }
        posted.reduce_into(self.n(), op, buf, o.ctx)
    }

    /// The broadcast of `buf` from `root` on the board: the root writes
    /// it, every other rank copies it.
    pub(super) async fn broadcast_board(
        &mut self,
        o: &Active<'_>,
        buf: &mut HostBuffer,
        root: usize,
    ) -> Result<(), WorkError> {
        let me = self.me();
        let payload: &[u8] = if me == root { buf.as_bytes() } else { &[] };
        let posted = self.post(o, payload).await?;
        if me != root {
            let dst = buf.as_bytes_mut();
            let len = dst.len();
            dst.copy_from_slice(posted.part(root, len, o.ctx)?);
        }
        Ok(())
    }

    /// The barrier on the board: every rank arrives.
    pub(super) async fn barrier_board(&mut self, o: &Active<'_>) -> Result<(), WorkError> {
        self.post(o, &[]).await.map(drop)
    }
}
