//! The direct small algorithms, where a group is small enough that one
//! round to every rank beats `log2 n` dependent rounds (see `choose`):
//! every rank sends to every other rank, and reductions run in rank order
//! (the order of `reference_reduce`).

use chorus_core::{HostBuffer, ReduceOp, WorkError};

use super::super::worker::{Active, Worker};
use super::exec::chunks;
use crate::reduce::finish_avg;

impl Worker {
    /// The all_reduce of `buf`: each chunk to every rank, then every
    /// rank's chunk reduced in rank order.
    pub(super) async fn all_reduce_direct(
        &mut self,
        o: &Active<'_>,
        buf: &mut HostBuffer,
        op: ReduceOp,
        ce: usize,
    ) -> Result<(), WorkError> {
        let (n, me) = (self.n(), self.me());
        let (count, es) = (buf.len(), buf.dtype().size());
        let all = 0..count;
        let mut frames = Vec::with_capacity(n - 1);
        for (c, b) in chunks(&all, ce, es) {
            // One copy for every local peer where it is large enough for a
            // broadcast slot.
            self.send_to_all(o, &buf.as_bytes()[b.clone()]).await?;
            frames.clear();
            for p in (0..n).filter(|&p| p != me) {
                frames.push(self.recv(o, p, b.len()).await?);
            }
            self.reduce_rank_order(op, buf, &c, None, &frames);
        }
        finish_avg(op, buf, all, n);
        Ok(())
    }

    /// The broadcast of `buf` from `root` to every rank; every other rank
    /// first sends the root an empty frame, which the root reads at the
    /// end, so that ranks that disagree on the root see each other's
    /// header.
    pub(super) async fn broadcast_direct(
        &mut self,
        o: &Active<'_>,
        buf: &mut HostBuffer,
        root: usize,
        ce: usize,
    ) -> Result<(), WorkError> {
        let (n, me) = (self.n(), self.me());
        let es = buf.dtype().size();
        let all = 0..buf.len();
        for (k, (_, b)) in chunks(&all, ce, es).enumerate() {
            if me == root {
                self.send_to_all(o, &buf.as_bytes()[b]).await?;
            } else {
                if k == 0 {
                    self.send(o, root, &[]).await?;
                }
                self.recv_into(o, root, &mut buf.as_bytes_mut()[b]).await?;
            }
        }
        if me == root {
            for p in (0..n).filter(|&p| p != me) {
                self.recv(o, p, 0).await?;
            }
        }
        Ok(())
    }

    /// The reduce of `buf` to `root`: the root first sends every rank an
    /// empty frame (read at the end), then reduces every rank's chunks in
    /// rank order.
    pub(super) async fn reduce_direct(
        &mut self,
        o: &Active<'_>,
        buf: &mut HostBuffer,
        root: usize,
        op: ReduceOp,
        ce: usize,
    ) -> Result<(), WorkError> {
        let (n, me) = (self.n(), self.me());
        let es = buf.dtype().size();
        let all = 0..buf.len();
        let mut frames = Vec::with_capacity(n - 1);
        if me == root {
            for p in self.others() {
                self.send(o, p, &[]).await?;
            }
        }
        for (c, b) in chunks(&all, ce, es) {
            if me == root {
                frames.clear();
                for p in (0..n).filter(|&p| p != me) {
                    frames.push(self.recv(o, p, b.len()).await?);
                }
                self.reduce_rank_order(op, buf, &c, None, &frames);
            } else {
                self.send(o, root, &buf.as_bytes()[b]).await?;
            }
        }
        if me == root {
            finish_avg(op, buf, all, n);
        } else {
            self.recv(o, root, 0).await?;
        }
        Ok(())
    }

    /// The barrier: an empty frame to and from every rank.
    pub(super) async fn barrier_direct(&mut self, o: &Active<'_>) -> Result<(), WorkError> {
        let (n, me) = (self.n(), self.me());
        for p in self.others() {
            self.send(o, p, &[]).await?;
        }
        for p in (0..n).filter(|&p| p != me) {
            self.recv(o, p, 0).await?;
        }
        Ok(())
    }
}
