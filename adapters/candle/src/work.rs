//! [`TensorWork`]: a chorus device work that yields a candle tensor.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use candle_core::Tensor;
use chorus::{DeviceWork, Failed, WorkError, WorkStatus};

use crate::buffer::TensorBuffer;

/// An op in flight on candle tensors; yields the result tensor.
///
/// The completion levels are chorus's: the op is enqueued once the call
/// that made this work returned; [`stream_ordered`](Self::stream_ordered)
/// gives the tensor back ordered after the op on the tensor's candle
/// stream (no host wait); `.await` and [`wait_timeout`](Self::wait_timeout)
/// return once the GPU has finished it.
///
/// Dropping the work does not cancel the op: its tensors stay alive until
/// the op's end event has completed.
///
/// # Cancel safety
///
/// Dropping the future of `.await` drops the work, as above.
#[derive(Debug)]
#[must_use = "the op's result and any error are in the work"]
pub struct TensorWork {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    /// In-place ops and sends: the tensor is the result.
    One(DeviceWork<TensorBuffer>),
    /// Out-of-place ops: the output (second) is the result.
    Two(DeviceWork<(TensorBuffer, TensorBuffer)>),
}

impl TensorWork {
    pub(crate) fn one(w: DeviceWork<TensorBuffer>) -> Self {
        TensorWork {
            inner: Inner::One(w),
        }
    }

    pub(crate) fn two(w: DeviceWork<(TensorBuffer, TensorBuffer)>) -> Self {
        TensorWork {
            inner: Inner::Two(w),
        }
    }

    /// The op's sequence number in its group.
    pub fn seq(&self) -> u64 {
        match &self.inner {
            Inner::One(w) => w.seq(),
            Inner::Two(w) => w.seq(),
        }
    }

    /// Where the op is (a query of its end event; never blocks).
    pub fn status(&self) -> WorkStatus {
        match &self.inner {
            Inner::One(w) => w.status(),
            Inner::Two(w) => w.status(),
        }
    }

    /// True once the GPU has finished the op (or it failed).
    pub fn is_done(&self) -> bool {
        match &self.inner {
            Inner::One(w) => w.is_done(),
            Inner::Two(w) => w.is_done(),
        }
    }

    /// The result tensor, ordered after the op on the tensor's candle
    /// stream: candle's next kernels there see the result, and the host
    /// does not wait for the GPU.
    ///
    /// # Errors
    ///
    /// The op's error if it has already failed.
    pub fn stream_ordered(self) -> Result<Tensor, WorkError> {
        match self.inner {
            Inner::One(w) => w
                .stream_ordered()
                .map(TensorBuffer::into_tensor)
                .map_err(Failed::into_error),
            Inner::Two(w) => w
                .stream_ordered()
                .map(|(_, o)| o.into_tensor())
                .map_err(Failed::into_error),
        }
    }

    /// Blocks until the GPU has finished the op, at most `timeout`. As
    /// with chorus's `wait_timeout`, a timeout aborts the group (every
    /// pending op fails).
    ///
    /// # Errors
    ///
    /// The op's error, or [`WorkError::OpTimeout`] naming the op.
    pub fn wait_timeout(self, timeout: Duration) -> Result<Tensor, WorkError> {
        match self.inner {
            Inner::One(w) => w
                .wait_timeout(timeout)
                .map(TensorBuffer::into_tensor)
                .map_err(Failed::into_error),
            Inner::Two(w) => w
                .wait_timeout(timeout)
                .map(|(_, o)| o.into_tensor())
                .map_err(Failed::into_error),
        }
    }
}

impl Future for TensorWork {
    type Output = Result<Tensor, WorkError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Both works are Unpin.
        match &mut self.get_mut().inner {
            Inner::One(w) => Pin::new(w)
                .poll(cx)
                .map(|r| r.map(TensorBuffer::into_tensor).map_err(Failed::into_error)),
            Inner::Two(w) => Pin::new(w)
                .poll(cx)
                .map(|r| r.map(|(_, o)| o.into_tensor()).map_err(Failed::into_error)),
        }
    }
}
