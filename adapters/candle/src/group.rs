//! [`TensorGroup`]: a chorus process group's ops on candle tensors.

use candle_core::{Shape, Tensor};
use chorus::{ProcessGroup, ReduceOp};

use crate::buffer::TensorBuffer;
use crate::error::{describe, TensorError};
use crate::work::TensorWork;

/// The ops of a chorus [`ProcessGroup`] on candle tensors.
///
/// Every op borrows its tensor (a refusal loses nothing) and returns a
/// [`TensorWork`] that yields the result tensor: the same tensor for the
/// in-place ops, a fresh one for the others. The group's timeout, error
/// policy, flight recorder and watchdog apply as to any chorus op.
///
/// # Errors
///
/// Every op fails with a [`TensorError`] before anything runs for a
/// tensor that is not on a CUDA device, not contiguous, of a dtype NCCL
/// has no type for, or of a shape the op cannot take; and with
/// [`TensorError::Refused`] where chorus refuses the op itself (a root or
/// peer out of range, a group that has failed).
#[derive(Clone, Debug)]
pub struct TensorGroup {
    pg: ProcessGroup,
}

impl TensorGroup {
    /// Runs candle tensor ops on `pg`.
    pub fn new(pg: ProcessGroup) -> Self {
        TensorGroup { pg }
    }

    /// The process group.
    pub fn process_group(&self) -> &ProcessGroup {
        &self.pg
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.pg.rank()
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.pg.size()
    }

    /// `t` as a [`TensorBuffer`], for chorus's own ops.
    ///
    /// # Errors
    ///
    /// As the ops, for a tensor chorus cannot use.
    pub fn buffer(&self, t: &Tensor) -> Result<TensorBuffer, TensorError> {
        TensorBuffer::new("buffer", self.rank(), t)
    }

    fn buf(&self, op: &'static str, t: &Tensor) -> Result<TensorBuffer, TensorError> {
        TensorBuffer::new(op, self.rank(), t)
    }

    /// A fresh tensor of `shape` on `like`'s device and dtype.
    fn fresh(&self, op: &'static str, like: &Tensor, shape: Shape) -> Result<Tensor, TensorError> {
        Tensor::zeros(shape, like.dtype(), like.device()).map_err(|source| TensorError::Alloc {
            op,
            rank: self.rank(),
            source,
        })
    }

    /// Reduces `t` across the ranks with `op`, in place: every rank's `t`
    /// holds the result.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<TensorWork, TensorError> {
        let b = self.buf("all_reduce", t)?;
        let w = self.pg.all_reduce(b, op).map_err(|r| r.error)?;
        Ok(TensorWork::one(w))
    }

    /// Broadcasts `t` from `root` into every rank's `t`, in place.
    pub fn broadcast(&self, t: &Tensor, root: usize) -> Result<TensorWork, TensorError> {
        let b = self.buf("broadcast", t)?;
        let w = self.pg.broadcast(b, root).map_err(|r| r.error)?;
        Ok(TensorWork::one(w))
    }

    /// Gathers every rank's `t` into a fresh tensor, concatenated along
    /// the first dimension in rank order: shape `[size * d0, d1, ...]`
    /// (`[size]` for a scalar).
    pub fn all_gather(&self, t: &Tensor) -> Result<TensorWork, TensorError> {
        const OP: &str = "all_gather";
        let input = self.buf(OP, t)?;
        let mut dims = t.dims().to_vec();
        match dims.first_mut() {
            Some(d0) => *d0 *= self.size(),
            None => dims.push(self.size()),
        }
        let out = self.buf(OP, &self.fresh(OP, t, Shape::from(dims))?)?;
        let w = self.pg.all_gather(input, out).map_err(|r| r.error)?;
        Ok(TensorWork::two(w))
    }

    /// Reduces `t` across the ranks with `op` and leaves rank `r` the
    /// `r`-th block of the first dimension, in a fresh tensor of shape
    /// `[d0 / size, d1, ...]`.
    ///
    /// # Errors
    ///
    /// [`TensorError::Shape`] for a scalar or a first dimension the world
    /// size does not divide.
    pub fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<TensorWork, TensorError> {
        const OP: &str = "reduce_scatter";
        let input = self.buf(OP, t)?;
        let n = self.size();
        let mut dims = t.dims().to_vec();
        match dims.first_mut() {
            Some(d0) if *d0 % n == 0 => *d0 /= n,
            first => {
                return Err(TensorError::Shape {
                    op: OP,
                    rank: self.rank(),
                    desc: describe(t),
                    why: match first {
                        None => "is a scalar; reduce_scatter splits the first dimension".into(),
                        Some(d0) => format!(
                        "has a first dimension of {d0}, which the world size {n} does not divide"
                    ),
                    },
                })
            }
        }
        let out = self.buf(OP, &self.fresh(OP, t, Shape::from(dims))?)?;
        let w = self
            .pg
            .reduce_scatter(input, out, op)
            .map_err(|r| r.error)?;
        Ok(TensorWork::two(w))
    }

    /// Sends `t` to rank `dst`; the work yields `t` once it may be
    /// reused.
    pub fn send(&self, t: &Tensor, dst: usize) -> Result<TensorWork, TensorError> {
        let b = self.buf("send", t)?;
        let w = self.pg.send(b, dst).map_err(|r| r.error)?;
        Ok(TensorWork::one(w))
    }

    /// Receives from rank `src` into `t`, in place (its shape and dtype
    /// must match what `src` sends).
    pub fn recv_into(&self, t: &Tensor, src: usize) -> Result<TensorWork, TensorError> {
        let b = self.buf("recv", t)?;
        let w = self.pg.recv(b, src).map_err(|r| r.error)?;
        Ok(TensorWork::one(w))
    }

    /// Receives from rank `src` into a fresh tensor shaped and typed like
    /// `like`, on its device.
    pub fn recv(&self, like: &Tensor, src: usize) -> Result<TensorWork, TensorError> {
        const OP: &str = "recv";
        // Check `like` first: a CPU or strided tensor is named as such.
        self.buf(OP, like)?;
        let fresh = self.fresh(OP, like, like.shape().clone())?;
        self.recv_into(&fresh, src)
    }
}
