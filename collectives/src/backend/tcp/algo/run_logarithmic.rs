//! Running the logarithmic schedules (`doubling`, `tree`,
//! `dissemination`) over the worker's connections.
//!
//! A tree depends on the root: ranks that disagree on it can each wait on
//! a parent that waits on someone else. So the rooted ops first pass an
//! empty frame around the ring (to the next rank, from the previous one),
//! which does not depend on the root: if any two ranks disagree, some
//! neighbours do, and the one that reads the other's header fails with the
//! mismatch (and its fault notice stops the others).

use chorus_core::{HostBuffer, ReduceOp, WorkError};

use super::super::worker::{Active, Worker};
use super::doubling::{self, Step};
use super::exec::{chunks, combine_bytes};
use super::{dissemination, tree};
use crate::reduce::finish_avg;

impl Worker {
    /// The all_reduce of `buf` by recursive doubling, `ce` elements a
    /// chunk (each chunk runs the whole schedule).
    pub(super) async fn all_reduce_doubling(
        &mut self,
        o: &Active<'_>,
        buf: &mut HostBuffer,
        op: ReduceOp,
        ce: usize,
    ) -> Result<(), WorkError> {
        let (n, me) = (self.n(), self.me());
        let (count, dtype) = (buf.len(), buf.dtype());
        let es = dtype.size();
        let steps = doubling::all_reduce(me, n);
        let all = 0..count;
        for (_, b) in chunks(&all, ce, es) {
            for &s in &steps {
                match s {
                    Step::Send { to } => self.send(o, to, &buf.as_bytes()[b.clone()]).await?,
                    Step::Fold { from } => {
                        let f = self.recv(o, from, b.len()).await?;
                        let mine = &mut buf.as_bytes_mut()[b.clone()];
                        combine_bytes(op, dtype, mine, f.payload.bytes());
                    }
                    Step::Exchange { peer } => {
                        self.send(o, peer, &buf.as_bytes()[b.clone()]).await?;
                        let mut f = self.recv(o, peer, b.len()).await?;
                        let mine = &mut buf.as_bytes_mut()[b.clone()];
                        // The lower rank's operand first, on both ranks.
                        if me < peer {
                            combine_bytes(op, dtype, mine, f.payload.bytes());
                        } else {
                            combine_bytes(op, dtype, f.payload.bytes_mut(), mine);
                            mine.copy_from_slice(f.payload.bytes());
                        }
                    }
                    Step::Result { from } => {
                        self.recv_into(o, from, &mut buf.as_bytes_mut()[b.clone()])
                            .await?
                    }
                }
            }
        }
        finish_avg(op, buf, all, n);
        Ok(())
    }

    /// The ring check of a rooted op (see the module docs): an empty frame
    /// to the next rank, then one from the previous rank.
    async fn ring_check(&mut self, o: &Active<'_>) -> Result<(), WorkError> {
        let (n, me) = (self.n(), self.me());
        if n > 1 {
            self.send(o, (me + 1) % n, &[]).await?;
            self.recv(o, (me + n - 1) % n, 0).await?;
        }
        Ok(())
    }

    /// The broadcast of `buf` from `root` down the binomial tree, after
    /// the ring check: each chunk from the parent and on to the children
    /// (largest subtree first).
    pub(super) async fn broadcast_tree(
        &mut self,
        o: &Active<'_>,
        buf: &mut HostBuffer,
        root: usize,
        ce: usize,
    ) -> Result<(), WorkError> {
        let node = tree::node(self.me(), self.n(), root);
        let es = buf.dtype().size();
        let all = 0..buf.len();
        self.ring_check(o).await?;
        for (_, b) in chunks(&all, ce, es) {
            if let Some(p) = node.parent {
                self.recv_into(o, p, &mut buf.as_bytes_mut()[b.clone()])
                    .await?;
            }
            for &c in node.children.iter().rev() {
                self.send(o, c, &buf.as_bytes()[b.clone()]).await?;
            }
        }
        Ok(())
    }

    /// The reduce of `buf` to `root` up the binomial tree, after the ring
    /// check: each chunk reduced from this rank's own and its children's
    /// (in order) and sent to the parent. Only the root's buffer changes.
    pub(super) async fn reduce_tree(
        &mut self,
        o: &Active<'_>,
        buf: &mut HostBuffer,
        root: usize,
        op: ReduceOp,
        ce: usize,
    ) -> Result<(), WorkError> {
        let n = self.n();
        let node = tree::node(self.me(), n, root);
        let dtype = buf.dtype();
        let es = dtype.size();
        let all = 0..buf.len();
        self.ring_check(o).await?;
        for (_, b) in chunks(&all, ce, es) {
            let mut acc = self.inner.pool.get(b.len());
            acc.bytes_mut().copy_from_slice(&buf.as_bytes()[b.clone()]);
            for &c in &node.children {
                let f = self.recv(o, c, b.len()).await?;
                combine_bytes(op, dtype, acc.bytes_mut(), f.payload.bytes());
            }
            match node.parent {
                Some(p) => self.send(o, p, acc.bytes()).await?,
                None => buf.as_bytes_mut()[b].copy_from_slice(acc.bytes()),
            }
        }
        if node.parent.is_none() {
            finish_avg(op, buf, all, n);
        }
        Ok(())
    }

    /// The dissemination barrier: an empty frame to the rank `2^k` ahead
    /// and one from the rank `2^k` behind, for every round `k`.
    pub(super) async fn barrier_dissemination(&mut self, o: &Active<'_>) -> Result<(), WorkError> {
        for (to, from) in dissemination::barrier(self.me(), self.n()) {
            self.send(o, to, &[]).await?;
            self.recv(o, from, 0).await?;
        }
        Ok(())
    }
}
