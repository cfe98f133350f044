//! Enqueueing one op on a [`Communicator`] (the two events of each launch:
//! the comm stream waits for the producers' input-ready event, the NCCL
//! call, the end event), and the checks before it.

use std::os::raw::c_int;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chorus_core::{Op, ReduceOp};
use nccl_sys::sys::{cudaStream_t, ncclComm_t, ncclResult_t};

use super::buffer::{DeviceBuffers, DeviceMem};
use super::communicator::{Communicator, EnqueueState};
use super::error::{nccl_err, NcclCommError};
use super::event_pool::EndEvent;
use super::forecast::{Forecast, Key};
use super::inflight::InFlight;
use super::types::{raw_dtype, raw_op};
use crate::cuda::CudaError;
use chorus_core::profile::Phase;
use chorus_core::sync::lock;
use chorus_core::DType;

/// An op with its buffers reduced to addresses, counts and a type: what
/// [`Communicator::issue`] hands NCCL.
#[derive(Clone, Copy, Debug)]
pub(super) struct RawOp {
    op: Op,
    ty: DType,
    p0: *mut std::ffi::c_void,
    c0: usize,
    p1: *mut std::ffi::c_void,
    c1: usize,
}

impl RawOp {
    /// What the forecast learns ops launched as one `ops` by, on the
    /// stream `queue` (their first op, their first buffers' bytes in all,
    /// their number), submitted now.
    pub(super) fn forecast(queue: u64, ops: &[RawOp]) -> Option<Forecast> {
        let first = ops.first()?;
        let bytes = ops.iter().map(|o| (o.c0 * o.ty.size()) as u64).sum();
        Some(Forecast {
            key: Key {
                queue,
                op: first.op,
                bytes,
                ops: u32::try_from(ops.len()).unwrap_or(u32::MAX),
            },
            submitted: std::time::Instant::now(),
            seen_running: false,
        })
    }

    /// `bufs` has one or two buffers (checked by [`Communicator::check`]).
    pub(super) fn new<C: DeviceBuffers>(op: Op, bufs: &C) -> RawOp {
        let ptr = |b: Option<&C::Buf>| {
            b.map_or(std::ptr::null_mut(), |b| {
                b.device_ptr() as *mut std::ffi::c_void
            })
        };
        RawOp {
            op,
            ty: bufs.get(0).map_or(DType::U8, |b| b.dtype()),
            p0: ptr(bufs.get(0)),
            c0: bufs.get(0).map_or(0, |b| b.count()),
            p1: ptr(bufs.get(1)),
            c1: bufs.get(1).map_or(0, |b| b.count()),
        }
    }
}

/// A refused submission: the error and the untouched buffers.
pub type Refused<C> = (NcclCommError, C);

impl Communicator {
    /// Checks `op` on `bufs` against this communicator: what
    /// [`Op::check`] checks (buffer count, root or peer, counts), and that
    /// every buffer is on this device with one element type.
    pub(super) fn check(&self, op: Op, bufs: &impl DeviceBuffers) -> Result<(), NcclCommError> {
        let bad = |m: String| Err(NcclCommError::InvalidArgument(m));
        if op == Op::Barrier {
            return bad(
                "barrier takes no buffers and has no NCCL call; run it on the host \
                        (ProcessGroup::barrier)"
                    .into(),
            );
        }
        let dev = self.device.ordinal();
        let first = bufs.get(0).map(|b| b.dtype());
        for b in bufs.iter() {
            if b.stream().device().ordinal() != dev {
                return bad(format!(
                    "a buffer is on device {} but the communicator on device {dev}",
                    b.stream().device().ordinal()
                ));
            }
            if let Some(t) = first.filter(|t| *t != b.dtype()) {
                return bad(format!(
                    "buffers of different types ({t} and {})",
                    b.dtype()
                ));
            }
        }
        let counts: smallvec::SmallVec<[usize; 2]> = bufs.iter().map(|b| b.count()).collect();
        op.check(self.nranks, &counts)
            .map_err(NcclCommError::InvalidArgument)
    }

    /// Enqueues `op` on `bufs` (the two events of rule 3 in docs/ARCHITECTURE.md): records an input-ready
    /// event on each buffer's producer stream, makes the communicator's
    /// stream wait on it, calls NCCL, records the end event. Calls on one
    /// communicator are serialized. Returns at once; the op runs on the GPU.
    ///
    /// # Errors
    ///
    /// The buffers come back untouched with the error when the arguments do
    /// not fit, the communicator is aborted, or a CUDA or NCCL call fails.
    pub fn submit<C: DeviceBuffers>(&self, op: Op, bufs: C) -> Result<InFlight<C>, Refused<C>> {
        self.submit_with_end(op, bufs, None)
    }

    /// An end event for an op about to be submitted with
    /// [`submit_with_end`](Self::submit_with_end) (e.g. to hand it to the
    /// op's registry entry first). Unused, it is free again once dropped.
    ///
    /// # Errors
    ///
    /// The CUDA error of creating an event when the pool is empty.
    pub fn reserve_end_event(&self) -> Result<Arc<EndEvent>, CudaError> {
        self.end_event()
    }

    /// [`submit`](Self::submit) with the end event `end` (from
    /// [`reserve_end_event`](Self::reserve_end_event); `None`: one from
    /// the pool).
    ///
    /// # Errors
    ///
    /// As for [`submit`](Self::submit).
    pub fn submit_with_end<C: DeviceBuffers>(
        &self,
        op: Op,
        bufs: C,
        end: Option<Arc<EndEvent>>,
    ) -> Result<InFlight<C>, Refused<C>> {
        self.submit_at(op, bufs, end, std::time::Instant::now())
    }

    /// [`submit_with_end`](Self::submit_with_end) for an op submitted at
    /// `submitted` (the caller's clock reading, e.g. the one its work was
    /// registered with: the enqueue path reads the clock once), from which
    /// its length is learned.
    ///
    /// # Errors
    ///
    /// As for [`submit`](Self::submit).
    pub fn submit_at<C: DeviceBuffers>(
        &self,
        op: Op,
        bufs: C,
        end: Option<Arc<EndEvent>>,
        submitted: std::time::Instant,
    ) -> Result<InFlight<C>, Refused<C>> {
        if let Err(e) = self.check(op, &bufs) {
            return Err((e, bufs));
        }
        let end = match end.map_or_else(|| self.reserve_end_event(), Ok) {
            Ok(e) => e,
            Err(e) => return Err((e.into(), bufs)),
        };
        let mut guard = lock(&self.enqueue);
        let prof = chorus_core::profile::on();
        if prof {
            chorus_core::profile::stamp(Phase::SubmitLock);
        }
        match self.enqueue_locked(&guard, op, &bufs, &end) {
            Ok(()) => {
                if prof {
                    chorus_core::profile::stamp(Phase::SubmitLaunch);
                }
                let pos = self.recorded(&mut guard, &end);
                drop(guard);
                let queue = self.stream.as_raw() as u64;
                let bytes = bufs.get(0).map_or(0, |b| b.count() * b.dtype().size()) as u64;
                Ok(InFlight {
                    device: self.device.clone(),
                    order: (queue, pos),
                    end,
                    bufs: Some(bufs),
                    retire: Some(self.retire.clone()),
                    forecast: Some(Forecast {
                        key: Key {
                            queue,
                            op,
                            bytes,
                            ops: 1,
                        },
                        submitted,
                        seen_running: false,
                    }),
                })
            }
            Err(e) => Err((e, bufs)),
        }
    }

    pub(super) fn enqueue_locked<C: DeviceBuffers>(
        &self,
        st: &EnqueueState,
        op: Op,
        bufs: &C,
        end: &EndEvent,
    ) -> Result<(), NcclCommError> {
        let comm = self.live_outside_capture()?;
        let Some(first) = bufs.get(0) else {
            return Err(NcclCommError::InvalidArgument(format!(
                "{op} was given no buffer"
            )));
        };
        // One context bind for the op's driver calls.
        self.device.bind_to_thread()?;
        // Input-ready: the comm stream waits for the producers.
        st.ready[0].record_bound(first.stream())?;
        self.stream.wait_event_bound(&st.ready[0])?;
        if let Some(second) = bufs.get(1) {
            if second.stream().as_raw() != first.stream().as_raw() {
                st.ready[1].record_bound(second.stream())?;
                self.stream.wait_event_bound(&st.ready[1])?;
            }
        }
        let raw = RawOp::new(op, bufs);
        // SAFETY: `comm` is live and we hold the enqueue lock; the pointers
        // of `raw` come from `bufs`, valid device memory of the stated count
        // and type on the communicator's device for as long as the buffers
        // live (the `InFlight` keeps them until the end event completes);
        // counts and roots were checked against the communicator.
        let (call, rc) = unsafe { self.issue(comm, &raw) };
        self.settle(call, rc)?;
        end.event().record_bound(&self.stream)?;
        Ok(())
    }

    /// Turns the result of an NCCL op call into `Ok` once the op is on the
    /// stream: a non-blocking communicator may return `ncclInProgress` while
    /// it is still being enqueued (e.g. connections set up on first use); it
    /// must be on the stream before the end event is recorded.
    pub(super) fn settle(&self, call: &'static str, rc: ncclResult_t) -> Result<(), NcclCommError> {
        if rc.is_in_progress() {
            IN_PROGRESS.fetch_add(1, Ordering::Relaxed);
            self.wait_idle(call, Duration::from_secs(300))
        } else if !rc.is_success() {
            Err(nccl_err(self.nccl, call, rc))
        } else {
            Ok(())
        }
    }

    /// Calls NCCL for one op on the communicator's stream; returns the
    /// call's name and result.
    ///
    /// # Safety
    ///
    /// `comm` is this communicator's live handle, the caller holds the
    /// enqueue lock, and the pointers of `raw` are device memory of the
    /// stated counts and type on this device that stays allocated until the
    /// op has run on the stream; `raw` passed [`check`](Self::check).
    pub(super) unsafe fn issue(
        &self,
        comm: ncclComm_t,
        raw: &RawOp,
    ) -> (&'static str, ncclResult_t) {
        let s = self.stream.as_raw() as cudaStream_t;
        let n = self.nccl;
        let (ty, p0, c0, p1, c1) = (raw_dtype(raw.ty), raw.p0, raw.c0, raw.p1, raw.c1);
        // On one rank the average is the sum; NCCL 2.28.3's one-rank
        // average path (a scaling kernel) was seen to leave the last element
        // of an odd-length f64 reduce_scatter unwritten on an H200.
        let red = |r: ReduceOp| match r {
            ReduceOp::Avg if self.nranks == 1 => raw_op(ReduceOp::Sum),
            r => raw_op(r),
        };
        let ok = |rc: ncclResult_t| rc.is_success() || rc.is_in_progress();
        // SAFETY: the caller's contract covers every pointer, count and the
        // communicator; nested group calls are allowed by NCCL.
        unsafe {
            match raw.op {
                // Refused by `check` before any op gets here.
                Op::Barrier => ("barrier", ncclResult_t::ncclInvalidArgument),
                Op::AllReduce(r) => (
                    "ncclAllReduce",
                    (n.ncclAllReduce)(p0, p0, c0, ty, red(r), comm, s),
                ),
                Op::Broadcast { root } => (
                    "ncclBroadcast",
                    (n.ncclBroadcast)(p0, p0, c0, ty, root as c_int, comm, s),
                ),
                Op::Reduce { root, op } => (
                    "ncclReduce",
                    (n.ncclReduce)(p0, p0, c0, ty, red(op), root as c_int, comm, s),
                ),
                Op::AllGather => ("ncclAllGather", (n.ncclAllGather)(p0, p1, c0, ty, comm, s)),
                Op::ReduceScatter(r) => (
                    "ncclReduceScatter",
                    (n.ncclReduceScatter)(p0, p1, c1, ty, red(r), comm, s),
                ),
                Op::Send { peer } => ("ncclSend", (n.ncclSend)(p0, c0, ty, peer as c_int, comm, s)),
                Op::Recv { peer } => ("ncclRecv", (n.ncclRecv)(p0, c0, ty, peer as c_int, comm, s)),
                Op::SendRecv { peer } => {
                    let mut rc = (n.ncclGroupStart)();
                    if rc.is_success() {
                        rc = (n.ncclSend)(p0, c0, ty, peer as c_int, comm, s);
                    }
                    if ok(rc) {
                        rc = (n.ncclRecv)(p1, c1, ty, peer as c_int, comm, s);
                    }
                    let end_rc = (n.ncclGroupEnd)();
                    (
                        "ncclSend/ncclRecv",
                        if rc.is_success() { end_rc } else { rc },
                    )
                }
                Op::AllToAll => {
                    let k = c0 / self.nranks;
                    let bytes = k * raw.ty.size();
                    let mut rc = (n.ncclGroupStart)();
                    for r in 0..self.nranks {
                        if !ok(rc) {
                            break;
                        }
                        rc = (n.ncclSend)(p0.byte_add(r * bytes), k, ty, r as c_int, comm, s);
                        if ok(rc) {
                            rc = (n.ncclRecv)(p1.byte_add(r * bytes), k, ty, r as c_int, comm, s);
                        }
                    }
                    let end_rc = (n.ncclGroupEnd)();
                    (
                        "all_to_all (grouped ncclSend/ncclRecv)",
                        if rc.is_success() { end_rc } else { rc },
                    )
                }
            }
        }
    }
}

/// How many NCCL op calls returned `ncclInProgress` (process-wide): each
/// then costs `ncclCommGetAsyncError` polls before the end event is
/// recorded.
#[cfg(feature = "test-util")]
pub fn in_progress_returns() -> u64 {
    IN_PROGRESS.load(Ordering::Relaxed)
}

static IN_PROGRESS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
