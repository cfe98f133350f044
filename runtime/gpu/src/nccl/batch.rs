//! Several ops in one NCCL group.
//!
//! * [`Batch`]: ops staged on one communicator, checked as they are pushed,
//!   and enqueued by [`Batch::launch`] inside one `ncclGroupStart` …
//!   `ncclGroupEnd`, so NCCL fuses them into one plan; one input-ready wait
//!   per producer stream and one end event for the whole batch. The group is
//!   opened and closed inside that one call on the calling thread: it can
//!   never be left open, and `Batch` is `!Send` besides (the ops' addresses
//!   were read on this thread).
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use chorus_core::Op;

use super::buffer::{DeviceBuffers, DeviceMem, NoBuffers};
use super::communicator::{Communicator, EnqueueState};
use super::enqueue::{RawOp, Refused};
use super::error::{nccl_err, NcclCommError};
use super::event_pool::EndEvent;
use super::forecast::Forecast;
use super::inflight::InFlight;
use super::items::Items;
use super::retire::RetireQueue;
use crate::cuda::{CudaError, Device, Event, Stream};
use crate::reactor::{self, Pending};
use chorus_core::sync::lock;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Names one op pushed into a [`Batch`] (or captured by a [`GraphCapture`](super::graph::GraphCapture)): its
/// buffers come back through it, with their type.
pub struct Ticket<C> {
    pub(super) owner: u64,
    pub(super) index: usize,
    pub(super) _b: PhantomData<fn() -> C>,
}

impl<C> fmt::Debug for Ticket<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("owner", &self.owner)
            .field("index", &self.index)
            .finish()
    }
}

impl<C> Clone for Ticket<C> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<C> Copy for Ticket<C> {}

/// Ops staged for one NCCL group on one communicator.
///
/// Nothing reaches NCCL before [`launch`](Self::launch); dropping the batch
/// instead drops the staged buffers, which no GPU work has seen.
pub struct Batch {
    pub(super) comm: Arc<Communicator>,
    pub(super) ops: Vec<RawOp>,
    /// Distinct producer streams of the staged buffers, in first-use order.
    pub(super) producers: Vec<Stream>,
    /// Each op's buffers (`C`), in push order.
    pub(super) items: Items,
    pub(super) id: u64,
    /// `ncclGroupStart`/`End` and the addresses read at push time stay on
    /// this thread.
    _not_send: PhantomData<*const ()>,
}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("comm", &self.comm)
            .field("ops", &self.ops.len())
            .finish()
    }
}

impl Communicator {
    /// An empty batch of ops for this communicator (see [`Batch`]), with
    /// room for as many ops as the last batch launched here had.
    pub fn batch(self: &Arc<Self>) -> Batch {
        let n = self.batch_len.load(Ordering::Relaxed);
        Batch {
            comm: self.clone(),
            ops: Vec::with_capacity(n),
            producers: Vec::new(),
            items: Items::with_capacity(n),
            id: next_id(),
            _not_send: PhantomData,
        }
    }
}

impl Batch {
    /// The communicator the batch runs on.
    pub fn communicator(&self) -> &Arc<Communicator> {
        &self.comm
    }

    /// Number of ops staged.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Room for ops staged without growing (at least the size of the last
    /// batch launched on the communicator): for a caller that keeps
    /// something per op beside it.
    pub fn capacity(&self) -> usize {
        self.ops.capacity()
    }

    /// True if no op was staged.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Checks `op` on `bufs` against the communicator (as
    /// [`Communicator::submit`] does) and stages it.
    ///
    /// # Errors
    ///
    /// The buffers come back untouched with [`NcclCommError::InvalidArgument`]
    /// when they do not fit the op or the communicator, or
    /// [`NcclCommError::Aborted`] when the communicator was aborted.
    pub fn push<C: DeviceBuffers>(&mut self, op: Op, bufs: C) -> Result<Ticket<C>, Refused<C>> {
        if let Err(e) = self.comm.live().and_then(|_| self.comm.check(op, &bufs)) {
            return Err((e, bufs));
        }
        for b in bufs.iter() {
            let s = b.stream();
            if !self.producers.iter().any(|p| p.as_raw() == s.as_raw()) {
                self.producers.push(s.clone());
            }
        }
        self.ops.push(RawOp::new(op, &bufs));
        let index = self.items.push(bufs);
        Ok(Ticket {
            owner: self.id,
            index,
            _b: PhantomData,
        })
    }

    /// Enqueues every staged op inside one `ncclGroupStart`/`ncclGroupEnd`
    /// on the communicator's stream: each producer stream's work so far is
    /// waited for first, one end event follows the group. Returns at once.
    ///
    /// The result always holds the buffers: take each op's back as an
    /// [`InFlight`] with [`Launched::take`]. If the launch failed
    /// ([`Launched::error`]), they are released once the stream has passed
    /// the failed group (at once when nothing was enqueued).
    pub fn launch(self) -> Launched {
        self.launch_with_end(None)
    }

    /// [`launch`](Self::launch) with the end event `end`, reserved before
    /// (with [`Communicator::reserve_end_event`]) so that the ops' works
    /// can hold it from their registration on; `None`: one from the pool.
    pub fn launch_with_end(self, end: Option<Arc<EndEvent>>) -> Launched {
        let comm = self.comm.clone();
        comm.batch_len.store(self.ops.len(), Ordering::Relaxed);
        let mut launched = Launched {
            device: comm.device.clone(),
            order: (comm.stream.as_raw() as u64, 0),
            end: None,
            items: Items::default(),
            owner: self.id,
            error: None,
            retire: comm.retire.clone(),
            forecast: None,
        };
        let end = match end.map_or_else(|| comm.end_event(), Ok) {
            Ok(e) => e,
            Err(e) => {
                // Nothing was enqueued: the buffers may go now.
                launched.error = Some(e.into());
                return launched;
            }
        };
        let forecast = RawOp::forecast(comm.stream.as_raw() as u64, &self.ops);
        let mut guard = lock(&comm.enqueue);
        let res = match comm.live_outside_capture() {
            Ok(raw) => comm.enqueue_group(&guard, raw, &self.ops, &self.producers, &end, None),
            Err(e) => Err((e, false)),
        };
        match res {
            Ok(()) => {
                launched.order.1 = comm.recorded(&mut guard, &end);
                launched.forecast = forecast;
            }
            Err((e, reached_nccl)) => {
                launched.error = Some(e);
                if reached_nccl {
                    // The group may have enqueued part of its work: the
                    // buffers wait for the stream.
                    if end.event().record(&comm.stream).is_ok() {
                        launched.order.1 = comm.recorded(&mut guard, &end);
                    } else {
                        tracing::error!("cannot order the release of a failed group's buffers after the stream; they are leaked");
                        std::mem::forget(self.items);
                        return launched;
                    }
                }
            }
        }
        drop(guard);
        launched.end = Some(end);
        launched.items = self.items;
        launched
    }
}

impl Communicator {
    /// Enqueues the one-buffer op `op` once on each of `bufs`, all inside
    /// one `ncclGroupStart`/`ncclGroupEnd` (NCCL fuses them into one plan
    /// and launch): one input-ready wait per producer stream and one end
    /// event for all of them. The returned [`InFlight`] holds every buffer,
    /// in order. This is the coalesced op (one op for the caller, one
    /// work), where a [`Batch`] stages ops that each keep their own.
    ///
    /// # Errors
    ///
    /// Refused before NCCL was called (a buffer that does not fit, a
    /// two-buffer `op`, no buffer, an aborted or capturing communicator,
    /// a CUDA error of the input-ready wait): the buffers come back
    /// untouched. If the group failed inside NCCL, part of it may have been
    /// enqueued: the buffers are then kept until the stream has passed the
    /// group (the completion reactor releases them) and the error comes
    /// back with none.
    pub fn submit_coalesced<B: DeviceMem>(
        &self,
        op: Op,
        bufs: Vec<B>,
    ) -> Result<InFlight<Vec<B>>, Refused<Vec<B>>> {
        self.submit_coalesced_with_end(op, bufs, None)
    }

    /// [`submit_coalesced`](Self::submit_coalesced) with the end event
    /// `end` (see [`submit_with_end`](Self::submit_with_end)).
    ///
    /// # Errors
    ///
    /// As for [`submit_coalesced`](Self::submit_coalesced).
    pub fn submit_coalesced_with_end<B: DeviceMem>(
        &self,
        op: Op,
        bufs: Vec<B>,
        end: Option<Arc<EndEvent>>,
    ) -> Result<InFlight<Vec<B>>, Refused<Vec<B>>> {
        let checked = if op.buffers() != 1 {
            Err(NcclCommError::InvalidArgument(format!(
                "{op} takes two buffers; only one-buffer ops can be coalesced"
            )))
        } else if bufs.is_empty() {
            Err(NcclCommError::InvalidArgument(
                "a coalesced op needs at least one buffer".into(),
            ))
        } else {
            self.live()
                .and_then(|_| bufs.iter().try_for_each(|b| self.check(op, b)))
        };
        if let Err(e) = checked {
            return Err((e, bufs));
        }
        let mut producers: Vec<Stream> = Vec::new();
        for b in &bufs {
            let s = b.stream();
            if !producers.iter().any(|p| p.as_raw() == s.as_raw()) {
                producers.push(s.clone());
            }
        }
        let ops: Vec<RawOp> = bufs.iter().map(|b| RawOp::new(op, b)).collect();
        let forecast = RawOp::forecast(self.stream.as_raw() as u64, &ops);
        let end = match end.map_or_else(|| self.reserve_end_event(), Ok) {
            Ok(e) => e,
            Err(e) => return Err((e.into(), bufs)),
        };
        let mut guard = lock(&self.enqueue);
        let res = match self.live_outside_capture() {
            Ok(raw) => self.enqueue_group(&guard, raw, &ops, &producers, &end, None),
            Err(e) => Err((e, false)),
        };
        let failed = match res {
            Ok(()) => None,
            Err((e, false)) => return Err((e, bufs)),
            Err((e, true)) => {
                // Part of the group may be on the stream: the buffers wait
                // for it (dropping the in-flight op below hands them to the
                // reactor).
                if end.event().record(&self.stream).is_err() {
                    drop(guard);
                    tracing::error!("cannot order the release of a failed coalesced op's buffers after the stream; they are leaked");
                    std::mem::forget(bufs);
                    return Err((e, Vec::new()));
                }
                Some(e)
            }
        };
        let pos = self.recorded(&mut guard, &end);
        drop(guard);
        let inflight = InFlight {
            device: self.device.clone(),
            order: (self.stream.as_raw() as u64, pos),
            end,
            bufs: Some(bufs),
            retire: Some(self.retire.clone()),
            // Learned only from ops that ran.
            forecast: forecast.filter(|_| failed.is_none()),
        };
        match failed {
            None => Ok(inflight),
            Some(e) => {
                drop(inflight);
                Err((e, Vec::new()))
            }
        }
    }

    /// Waits for the producers, issues `ops` as one NCCL group, records `end`
    /// (and makes `join` wait on it). The caller holds the enqueue lock
    /// (`st`). The error says whether NCCL was called.
    pub(super) fn enqueue_group(
        &self,
        st: &EnqueueState,
        raw: nccl_sys::sys::ncclComm_t,
        ops: &[RawOp],
        producers: &[Stream],
        end: &EndEvent,
        join: Option<&Stream>,
    ) -> Result<(), (NcclCommError, bool)> {
        let not_yet = |e: CudaError| (NcclCommError::from(e), false);
        // One event re-recorded per producer: a stream wait captures the
        // event's state at the call.
        let ready = &st.ready[0];
        for p in producers {
            ready.record(p).map_err(not_yet)?;
            self.stream.wait_event(ready).map_err(not_yet)?;
        }
        let n = self.nccl;
        // SAFETY: ncclGroupStart takes no arguments; it is paired with the
        // ncclGroupEnd below on this thread whatever happens in between.
        let rc = unsafe { (n.ncclGroupStart)() };
        if !rc.is_success() {
            return Err((nccl_err(n, "ncclGroupStart", rc), false));
        }
        let mut failed = None;
        for op in ops {
            // SAFETY: `raw` is live and the caller holds the enqueue lock;
            // each op passed `check` when pushed, and its buffers are kept by
            // the caller until the end event completes (`Launched`) or by the
            // graph that replays them (`GraphCapture`).
            let (call, rc) = unsafe { self.issue(raw, op) };
            if !(rc.is_success() || rc.is_in_progress()) {
                failed = Some(nccl_err(n, call, rc));
                break;
            }
        }
        // SAFETY: closes the group opened above, on the same thread.
        let rc = unsafe { (n.ncclGroupEnd)() };
        if let Some(e) = failed {
            return Err((e, true));
        }
        self.settle("ncclGroupEnd", rc).map_err(|e| (e, true))?;
        end.event()
            .record(&self.stream)
            .map_err(|e| (e.into(), true))?;
        if let Some(j) = join {
            j.wait_event(end.event()).map_err(|e| (e.into(), true))?;
        }
        Ok(())
    }
}

/// A launched [`Batch`]: its end event and the ops' buffers.
///
/// Dropping it with buffers not taken keeps them alive until the end event
/// completes (the completion reactor releases them).
pub struct Launched {
    device: Device,
    order: (u64, u64),
    end: Option<Arc<EndEvent>>,
    items: Items,
    owner: u64,
    error: Option<NcclCommError>,
    /// Where an op taken from the launch and then let go of is retired.
    retire: Arc<RetireQueue>,
    /// The launch's key and submission, for its end as one op
    /// ([`group_end`](Self::group_end)); `None` for a failed launch.
    forecast: Option<Forecast>,
}

impl fmt::Debug for Launched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launched")
            .field("ops", &self.items.len())
            .field("error", &self.error)
            .finish()
    }
}

impl Launched {
    /// Why the launch failed, if it did.
    pub fn error(&self) -> Option<&NcclCommError> {
        self.error.as_ref()
    }

    /// The end of the whole launch, as an op without buffers: a work for
    /// the group as one (each op's buffers stay here until taken; those
    /// never taken are kept until the end event completes when the
    /// `Launched` drops). `None` if the launch failed before it had an end
    /// event.
    pub fn group_end(&self) -> Option<InFlight<NoBuffers>> {
        let end = self.end.clone()?;
        Some(InFlight {
            device: self.device.clone(),
            order: self.order,
            end,
            bufs: Some(NoBuffers),
            retire: Some(self.retire.clone()),
            forecast: self.forecast,
        })
    }

    /// The group's end event (recorded on the communicator's stream after
    /// the group); `None` if the launch failed before anything was enqueued.
    pub fn end_event(&self) -> Option<&Event> {
        self.end.as_deref().map(EndEvent::event)
    }

    /// Takes the buffers of the op `ticket` names, as an [`InFlight`] that
    /// shares the group's end event (let go of, it goes to the
    /// communicator's retire queue as a lone op's does). `None` for a ticket of another batch, one
    /// taken before, or a failed launch that enqueued nothing (the buffers are
    /// then dropped with this value).
    pub fn take<C: DeviceBuffers>(&mut self, ticket: Ticket<C>) -> Option<InFlight<C>> {
        self.take_ref(&ticket)
    }

    /// The buffers of the op `ticket` names, if the launch's end event is
    /// already known complete (an earlier query saw it): nothing is left to
    /// wait for, so they come back as they are, without an [`InFlight`] or
    /// a query. `None` otherwise, or for a ticket of another launch or one
    /// taken before.
    pub fn take_if_complete<C: DeviceBuffers>(&mut self, ticket: &Ticket<C>) -> Option<C> {
        if ticket.owner != self.owner || !self.end.as_ref()?.known_complete() {
            return None;
        }
        self.items.take::<C>(ticket.index)
    }

    /// [`take`](Self::take) through a borrowed ticket (the op's buffers
    /// come back once, to the first call).
    pub fn take_ref<C: DeviceBuffers>(&mut self, ticket: &Ticket<C>) -> Option<InFlight<C>> {
        if ticket.owner != self.owner {
            return None;
        }
        let end = self.end.clone()?;
        let bufs = self.items.take::<C>(ticket.index)?;
        Some(InFlight {
            device: self.device.clone(),
            order: self.order,
            end,
            bufs: Some(bufs),
            retire: Some(self.retire.clone()),
            forecast: None,
        })
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        let rest = std::mem::take(&mut self.items);
        let Some(end) = self.end.take() else {
            return;
        };
        if !rest.any_left() || matches!(end.is_complete(), Ok(true)) {
            return;
        }
        let entry = KeepAlive {
            device: self.device.clone(),
            order: self.order,
            end,
            items: Some(rest),
        };
        if let Err((e, mut entry)) = reactor::global().register(Box::new(entry)) {
            tracing::error!(error = %e, "no completion reactor; waiting on the GPU inline");
            while !entry.poll_complete() {
                std::thread::yield_now();
            }
        }
    }
}

/// Buffers kept until an end event completes.
struct KeepAlive {
    device: Device,
    order: (u64, u64),
    end: Arc<EndEvent>,
    items: Option<Items>,
}

impl Pending for KeepAlive {
    fn order(&self) -> Option<(u64, u64)> {
        Some(self.order)
    }

    fn poll_complete(&mut self) -> bool {
        let _ = self.device.bind_to_thread();
        crate::cuda::relax_capture_mode();
        match self.end.is_complete() {
            Ok(false) => false,
            Ok(true) => {
                self.items = None;
                true
            }
            Err(e) => {
                // The device failed: the GPU no longer runs this work.
                tracing::error!(error = %e, "a group's end event failed");
                self.items = None;
                true
            }
        }
    }
}
