//! CUDA graph capture of NCCL ops.
//!
//! * [`GraphCapture`]: a CUDA graph capture on a stream. A [`Batch`] launched
//!   into it is captured instead of run: the communicator's stream joins
//!   the capture and is joined back by the capturing stream after every
//!   batch, so ending the capture always finds every stream joined. While a
//!   capture holds a communicator, ops outside the capture on that
//!   communicator are refused ([`NcclCommError::Capturing`]): its stream
//!   would capture them.
//! * [`Graph`]: the instantiated graph. It owns the captured ops' buffers
//!   and holds their communicators, so neither can go away while the graph
//!   can still be replayed; dropping it waits for its last replay first.

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use cudarc::driver::sys;

use super::batch::{Batch, Ticket};
use super::buffer::DeviceBuffers;
use super::communicator::Communicator;
use super::error::NcclCommError;
use super::items::Items;
use crate::cuda::{driver_error, CudaError, Device, Event, Stream};
use chorus_core::sync::lock;

/// A CUDA graph capture on one stream (`cuStreamBeginCapture` in
/// thread-local mode: other threads, such as chorus's completion reactor,
/// keep working while it runs).
///
/// Launch batches into it with [`launch`](Self::launch); enqueue other work
/// (kernels, copies) on [`stream`](Self::stream). [`finish`](Self::finish)
/// ends the capture and instantiates the [`Graph`]. Dropping the capture
/// unfinished ends it and discards what was captured. `!Send`: a capture
/// belongs to the thread that began it.
pub struct GraphCapture {
    stream: Stream,
    comms: Vec<Arc<Communicator>>,
    /// Each captured batch's id and buffers.
    items: Vec<(u64, Items)>,
    open: bool,
    _not_send: PhantomData<*const ()>,
}

impl fmt::Debug for GraphCapture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphCapture")
            .field("stream", &self.stream)
            .field("ops", &self.items.len())
            .finish()
    }
}

impl GraphCapture {
    /// Begins capturing `stream` (which must not be capturing already, and
    /// must not be the legacy default stream).
    ///
    /// # Errors
    ///
    /// The CUDA error of `cuStreamBeginCapture`.
    pub fn begin(stream: &Stream) -> Result<GraphCapture, CudaError> {
        stream.device().bind_to_thread()?;
        // SAFETY: the stream is live (we hold it); thread-local mode only
        // restricts this thread.
        let rc = unsafe {
            sys::cuStreamBeginCapture_v2(
                stream.as_raw(),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        };
        check(rc, "cuStreamBeginCapture")?;
        Ok(GraphCapture {
            stream: stream.clone(),
            comms: Vec::new(),
            items: Vec::new(),
            open: true,
            _not_send: PhantomData,
        })
    }

    /// Reserves `comm` for this capture until it ends: from now on the
    /// communicator refuses ops outside the capture
    /// ([`NcclCommError::Capturing`]), since they would wait on the
    /// capturing stream or run on a stream that joined the capture.
    /// [`launch`](Self::launch) holds the batch's communicator itself; hold
    /// it earlier to refuse stray ops from the start.
    ///
    /// # Errors
    ///
    /// [`NcclCommError::Capturing`] if another capture holds it,
    /// [`NcclCommError::Aborted`] if it was aborted.
    pub fn hold(&mut self, comm: &Arc<Communicator>) -> Result<(), NcclCommError> {
        comm.live()?;
        if self.comms.iter().any(|c| Arc::ptr_eq(c, comm)) {
            return Ok(());
        }
        if comm.capturing.swap(true, Ordering::AcqRel) {
            return Err(NcclCommError::Capturing);
        }
        self.comms.push(comm.clone());
        Ok(())
    }

    /// The capturing stream: work enqueued here is captured too, ordered
    /// with the batches as issued.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Captures `batch` as one NCCL group: the communicator's stream waits
    /// for the capturing stream (and the batch's producer streams, which
    /// must be the capturing stream or streams already in the capture), then
    /// the capturing stream waits for the group. The buffers move into the
    /// capture; the tickets are valid on the finished graph.
    ///
    /// # Errors
    ///
    /// An aborted communicator, one captured by another capture, or the
    /// CUDA/NCCL error (the capture is then usually invalidated: finish
    /// reports it). The batch's buffers are kept by the capture in any case.
    pub fn launch(&mut self, batch: Batch) -> Result<(), NcclCommError> {
        let Batch {
            comm,
            ops,
            mut producers,
            items,
            id,
            ..
        } = batch;
        self.items.push((id, items));
        let end = comm.end_event()?;
        self.hold(&comm)?;
        let st = lock(&comm.enqueue);
        let raw = comm.live()?;
        // The communicator's stream joins the capture by waiting on the
        // capturing stream.
        if !producers.iter().any(|p| p.as_raw() == self.stream.as_raw()) {
            producers.insert(0, self.stream.clone());
        }
        comm.enqueue_group(&st, raw, &ops, &producers, &end, Some(&self.stream))
            .map_err(|(e, _)| e)
    }

    /// Ends the capture and instantiates the graph.
    ///
    /// # Errors
    ///
    /// The CUDA error of ending (e.g. the capture was invalidated by a
    /// prohibited call) or of instantiating; what was captured is discarded.
    pub fn finish(mut self) -> Result<Graph, CudaError> {
        let (graph, end_rc) = self.end();
        let items = std::mem::take(&mut self.items);
        let comms = std::mem::take(&mut self.comms);
        check(end_rc, "cuStreamEndCapture")?;
        if graph.is_null() {
            return Err(CudaError::Driver {
                call: "cuStreamEndCapture",
                code: 0,
                name: "no graph was captured".into(),
            });
        }
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: `graph` is the graph the capture returned; `exec` is
        // written on success.
        let rc = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if let Err(e) = check(rc, "cuGraphInstantiateWithFlags") {
            // SAFETY: `graph` is ours and no exec was created.
            unsafe { sys::cuGraphDestroy(graph) };
            return Err(e);
        }
        let done = self.stream.device().new_event()?;
        Ok(Graph {
            device: self.stream.device().clone(),
            graph,
            exec,
            comms,
            items,
            done,
            launched: false,
        })
    }

    /// Ends the capture (once) and releases the communicators.
    fn end(&mut self) -> (sys::CUgraph, sys::CUresult) {
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        if !self.open {
            return (graph, sys::CUresult::CUDA_SUCCESS);
        }
        self.open = false;
        let _ = self.stream.device().bind_to_thread();
        // SAFETY: the stream is capturing (begun by `begin`) and live.
        let rc = unsafe { sys::cuStreamEndCapture(self.stream.as_raw(), &mut graph) };
        for c in &self.comms {
            c.capturing.store(false, Ordering::Release);
        }
        (graph, rc)
    }
}

impl Drop for GraphCapture {
    fn drop(&mut self) {
        let (graph, _) = self.end();
        if !graph.is_null() {
            // SAFETY: the graph is ours and was never instantiated.
            unsafe { sys::cuGraphDestroy(graph) };
        }
    }
}

fn check(rc: sys::CUresult, call: &'static str) -> Result<(), CudaError> {
    if rc == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(driver_error(call, cudarc::driver::DriverError(rc)))
    }
}

/// An instantiated CUDA graph of captured NCCL ops (and whatever else was
/// captured). It owns the captured ops' buffers and keeps their
/// communicators alive: replays always find both.
pub struct Graph {
    device: Device,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    comms: Vec<Arc<Communicator>>,
    items: Vec<(u64, Items)>,
    /// Recorded after each replay; waited for before the graph goes.
    done: Event,
    launched: bool,
}

// SAFETY: the graph and its exec are only used through `&mut self` (replay)
// or in `drop`, so calls on them are serialized as CUDA requires; the
// buffers are `Send`.
unsafe impl Send for Graph {}

impl fmt::Debug for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Graph")
            .field("device", &self.device.ordinal())
            .field("ops", &self.items.len())
            .finish()
    }
}

impl Graph {
    /// Replays the graph on `stream` (`cuGraphLaunch`) and records the
    /// replay's done event after it. Returns at once.
    ///
    /// Every rank must replay its graph in the same order relative to its
    /// other ops on the same communicators, as for any NCCL op.
    ///
    /// # Errors
    ///
    /// [`NcclCommError::Aborted`] if a communicator of the graph was aborted
    /// (nothing is launched), or the CUDA error of the launch.
    pub fn launch(&mut self, stream: &Stream) -> Result<(), NcclCommError> {
        for c in &self.comms {
            c.live()?;
        }
        self.device.bind_to_thread()?;
        // SAFETY: `exec` is live (destroyed only in drop) and used under
        // `&mut self`; the stream is live.
        let rc = unsafe { sys::cuGraphLaunch(self.exec, stream.as_raw()) };
        check(rc, "cuGraphLaunch")?;
        self.launched = true;
        self.done.record(stream)?;
        Ok(())
    }

    /// The event recorded after the latest replay.
    pub fn done_event(&self) -> &Event {
        &self.done
    }

    /// The buffers of a captured op. `None` for a ticket of a batch this
    /// graph did not capture.
    pub fn buffers<C: DeviceBuffers>(&self, ticket: Ticket<C>) -> Option<&C> {
        self.items
            .iter()
            .find(|(id, _)| *id == ticket.owner)?
            .1
            .get::<C>(ticket.index)
    }

    /// The buffers of a captured op, mutable (to fill inputs between
    /// replays: order such work after [`done_event`](Self::done_event)).
    pub fn buffers_mut<C: DeviceBuffers>(&mut self, ticket: Ticket<C>) -> Option<&mut C> {
        self.items
            .iter_mut()
            .find(|(id, _)| *id == ticket.owner)?
            .1
            .get_mut::<C>(ticket.index)
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let _ = self.device.bind_to_thread();
        if self.launched {
            // The last replay must be done before its buffers go.
            if let Err(e) = self.done.synchronize() {
                tracing::error!(error = %e, "a graph replay failed; its buffers are leaked");
                for item in self.items.drain(..) {
                    std::mem::forget(item);
                }
            }
        }
        // SAFETY: both handles are ours; no replay is running any more.
        unsafe {
            sys::cuGraphExecDestroy(self.exec);
            sys::cuGraphDestroy(self.graph);
        }
    }
}
