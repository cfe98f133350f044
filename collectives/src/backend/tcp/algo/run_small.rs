//! Running the logarithmic schedules (`doubling`, `tree`,
//! `dissemination`) over the worker's connections. Every edge of a tree
//! carries a frame both ways, so ranks that disagree on the root meet a
//! header that says so.

use chorus_core::{HostBuffer, ReduceOp, WorkError};

use super::super::worker::{Active, Worker};
use super::doubling::{self, Step};
use super::exec::{bytes, chunk, combine_bytes, nchunks};
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
        for k in 0..nchunks(count, ce) {
            let b = bytes(&chunk(&all, ce, k), es);
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

    /// The broadcast of `buf` from `root` down the binomial tree: an empty
    /// frame up to the parent first, then each chunk from the parent and
    /// on to the children (largest subtree first), then an empty frame
    /// from each child.
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
        if let Some(p) = node.parent {
            self.send(o, p, &[]).await?;
        }
        for k in 0..nchunks(all.len(), ce) {
            let b = bytes(&chunk(&all, ce, k), es);
            if let Some(p) = node.parent {
                self.recv_into(o, p, &mut buf.as_bytes_mut()[b.clone()])
                    .await?;
            }
            for &c in node.children.iter().rev() {
                self.send(o, c, &buf.as_bytes()[b.clone()]).await?;
            }
        }
        for &c in &node.children {
            self.recv(o, c, 0).await?;
        }
        Ok(())
    }

    /// The reduce of `buf` to `root` up the binomial tree: an empty frame
    /// down to each child first, then each chunk reduced from this rank's
    /// own and its children's (in order) and sent to the parent, then an
    /// empty frame from the parent. Only the root's buffer changes.
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
        for &c in &node.children {
            self.send(o, c, &[]).await?;
        }
        for k in 0..nchunks(all.len(), ce) {
            let b = bytes(&chunk(&all, ce, k), es);
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
        match node.parent {
            Some(p) => {
                self.recv(o, p, 0).await?;
            }
            None => finish_avg(op, buf, all, n),
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
