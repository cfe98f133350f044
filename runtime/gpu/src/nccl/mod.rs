//! NCCL communicators and device buffers: the safe layer between `nccl-sys`
//! and chorus's NCCL backend (DESIGN §2 rule 3, §3).
//!
//! * [`DeviceBuffer`] owns a cudarc device slice and names its producer
//!   stream; [`RawDeviceBuffer`] describes memory of another tensor library
//!   (its `unsafe` constructor is the raw-pointer entry).
//! * [`Communicator`]: one NCCL communicator, created non-blocking
//!   ([`PendingComm`], polled through `ncclCommGetAsyncError`), with its own
//!   CUDA stream; [`Communicator::submit`] enqueues an op (input-ready event
//!   on each producer stream, the comm stream waits on it, the NCCL call, the
//!   end event on the comm stream), serialized by a mutex.
//! * [`InFlight`]: the op's buffers and end event. Its buffers are never
//!   released before the end event completes: dropping an unfinished
//!   `InFlight` hands them to the completion [`reactor`](crate::reactor::Reactor),
//!   which drops them afterwards.

use std::fmt;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, DevicePtr};
use nccl_sys::sys::{
    cudaStream_t, ncclComm_t, ncclConfig_t, ncclDataType_t, ncclRedOp_t, ncclResult_t,
    ncclUniqueId, NCCL_SPLIT_NOCOLOR,
};
use nccl_sys::Nccl;

use crate::cuda::{CudaError, Device, Event, Stream, StreamPriority};
use retire::{Detached, RetireQueue};

pub mod batch;
mod retire;
use crate::reactor::{self, Pending};

/// Element types NCCL reduces and moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NcclType {
    /// `ncclInt8`.
    I8,
    /// `ncclUint8`.
    U8,
    /// `ncclInt32`.
    I32,
    /// `ncclUint32`.
    U32,
    /// `ncclInt64`.
    I64,
    /// `ncclUint64`.
    U64,
    /// `ncclFloat16`.
    F16,
    /// `ncclBfloat16`.
    BF16,
    /// `ncclFloat32`.
    F32,
    /// `ncclFloat64`.
    F64,
}

impl NcclType {
    fn raw(self) -> ncclDataType_t {
        match self {
            NcclType::I8 => ncclDataType_t::ncclInt8,
            NcclType::U8 => ncclDataType_t::ncclUint8,
            NcclType::I32 => ncclDataType_t::ncclInt32,
            NcclType::U32 => ncclDataType_t::ncclUint32,
            NcclType::I64 => ncclDataType_t::ncclInt64,
            NcclType::U64 => ncclDataType_t::ncclUint64,
            NcclType::F16 => ncclDataType_t::ncclFloat16,
            NcclType::BF16 => ncclDataType_t::ncclBfloat16,
            NcclType::F32 => ncclDataType_t::ncclFloat32,
            NcclType::F64 => ncclDataType_t::ncclFloat64,
        }
    }

    /// Lower-case name, as in `f32`.
    pub fn name(self) -> &'static str {
        match self {
            NcclType::I8 => "i8",
            NcclType::U8 => "u8",
            NcclType::I32 => "i32",
            NcclType::U32 => "u32",
            NcclType::I64 => "i64",
            NcclType::U64 => "u64",
            NcclType::F16 => "f16",
            NcclType::BF16 => "bf16",
            NcclType::F32 => "f32",
            NcclType::F64 => "f64",
        }
    }

    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            NcclType::I8 | NcclType::U8 => 1,
            NcclType::F16 | NcclType::BF16 => 2,
            NcclType::I32 | NcclType::U32 | NcclType::F32 => 4,
            NcclType::I64 | NcclType::U64 | NcclType::F64 => 8,
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A Rust element type NCCL supports. Sealed.
pub trait NcclElement: cudarc::driver::DeviceRepr + Send + Sync + 'static + sealed::Sealed {
    /// Its NCCL type.
    const TYPE: NcclType;
}

macro_rules! elements {
    ($($t:ty => $v:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl NcclElement for $t { const TYPE: NcclType = NcclType::$v; }
    )*};
}
elements!(i8 => I8, u8 => U8, i32 => I32, u32 => U32, i64 => I64, u64 => U64,
    half::f16 => F16, half::bf16 => BF16, f32 => F32, f64 => F64);

/// A reduction NCCL applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NcclRedOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Average (sum divided by the number of ranks).
    Avg,
}

impl NcclRedOp {
    fn raw(self) -> ncclRedOp_t {
        match self {
            NcclRedOp::Sum => ncclRedOp_t::ncclSum,
            NcclRedOp::Prod => ncclRedOp_t::ncclProd,
            NcclRedOp::Max => ncclRedOp_t::ncclMax,
            NcclRedOp::Min => ncclRedOp_t::ncclMin,
            NcclRedOp::Avg => ncclRedOp_t::ncclAvg,
        }
    }
}

/// Device memory an NCCL op may read and write: valid for as long as the
/// value lives. Implemented by [`DeviceBuffer`] and [`RawDeviceBuffer`].
/// Sealed.
pub trait DeviceMem: Send + 'static + sealed::Sealed {
    /// Start address.
    fn device_ptr(&self) -> u64;
    /// Number of elements.
    fn count(&self) -> usize;
    /// Element type.
    fn nccl_type(&self) -> NcclType;
    /// The stream that produces (and later consumes) the data: the op waits
    /// for the work issued to it before the op.
    fn stream(&self) -> &Stream;
}

/// A device buffer for NCCL ops: a cudarc slice plus the stream that
/// produces its data (by default the slice's own stream).
///
/// An op moves the buffer in and gives it back; while the op runs nothing
/// else can touch it.
pub struct DeviceBuffer<T> {
    slice: CudaSlice<T>,
    stream: Stream,
    ptr: u64,
}

impl<T> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("len", &self.slice.len())
            .field("device", &self.stream.device().ordinal())
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .finish()
    }
}

impl<T: NcclElement> DeviceBuffer<T> {
    /// Wraps `slice`; its producer stream is the slice's own stream.
    ///
    /// # Errors
    ///
    /// As [`Stream::from_cudarc`].
    pub fn new(slice: CudaSlice<T>) -> Result<Self, CudaError> {
        let stream = Stream::from_cudarc(slice.stream().clone())?;
        Ok(Self::with_parts(slice, stream))
    }

    /// Wraps `slice` whose data is produced on `stream`.
    ///
    /// # Errors
    ///
    /// [`CudaError::DeviceMismatch`] if the stream is on another device.
    pub fn on_stream(slice: CudaSlice<T>, stream: Stream) -> Result<Self, CudaError> {
        let dev = slice.stream().context().ordinal();
        if dev != stream.device().ordinal() {
            return Err(CudaError::DeviceMismatch {
                what: "DeviceBuffer::on_stream",
                event_device: dev,
                stream_device: stream.device().ordinal(),
            });
        }
        Ok(Self::with_parts(slice, stream))
    }

    fn with_parts(slice: CudaSlice<T>, stream: Stream) -> Self {
        let ptr = {
            let (p, _sync) = slice.device_ptr(slice.stream());
            p
        };
        DeviceBuffer { slice, stream, ptr }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// True if it has no elements.
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }

    /// The slice.
    pub fn slice(&self) -> &CudaSlice<T> {
        &self.slice
    }

    /// The slice, mutably (e.g. to launch a kernel that writes it).
    pub fn slice_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }

    /// The producer stream.
    pub fn producer(&self) -> &Stream {
        &self.stream
    }

    /// The device the buffer lives on.
    pub fn device(&self) -> &Device {
        self.stream.device()
    }

    /// Gives the slice back.
    pub fn into_slice(self) -> CudaSlice<T> {
        self.slice
    }
}

impl<T: NcclElement> sealed::Sealed for DeviceBuffer<T> {}
impl<T: NcclElement> DeviceMem for DeviceBuffer<T> {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn count(&self) -> usize {
        self.slice.len()
    }
    fn nccl_type(&self) -> NcclType {
        T::TYPE
    }
    fn stream(&self) -> &Stream {
        &self.stream
    }
}

/// Device memory owned by someone else (another tensor library), described
/// by a raw pointer: the raw-pointer entry of the NCCL backend.
#[derive(Debug)]
pub struct RawDeviceBuffer {
    ptr: u64,
    count: usize,
    dtype: NcclType,
    stream: Stream,
}

impl RawDeviceBuffer {
    /// Describes `count` elements of `dtype` at device address `ptr` on the
    /// device of `stream`, produced on `stream`.
    ///
    /// # Safety
    ///
    /// The memory must be a valid allocation of at least
    /// `count × dtype.size()` bytes on `stream`'s device, and must stay
    /// allocated, and untouched by other work not ordered after the op, until
    /// the op's work has completed (awaited, or its end event observed
    /// complete) — also if the work is dropped. chorus never frees it.
    pub unsafe fn new(ptr: u64, count: usize, dtype: NcclType, stream: Stream) -> Self {
        RawDeviceBuffer {
            ptr,
            count,
            dtype,
            stream,
        }
    }
}

impl sealed::Sealed for RawDeviceBuffer {}
impl DeviceMem for RawDeviceBuffer {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn count(&self) -> usize {
        self.count
    }
    fn nccl_type(&self) -> NcclType {
        self.dtype
    }
    fn stream(&self) -> &Stream {
        &self.stream
    }
}

/// What went wrong with an NCCL communicator or op.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NcclCommError {
    /// No usable NCCL library (the text says what was searched).
    #[error("NCCL unavailable: {0}")]
    Unavailable(String),
    /// A CUDA call failed (or there is no GPU).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// An NCCL call failed.
    #[error("{call} failed: {detail}")]
    Nccl {
        /// The NCCL function.
        call: &'static str,
        /// Its result code.
        code: i32,
        /// NCCL's description and last error.
        detail: String,
    },
    /// The op's arguments do not fit the communicator.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The communicator was aborted; it is never used again.
    #[error("the NCCL communicator was aborted ({0}); create a new group to continue")]
    Aborted(String),
    /// The communicator's stream is being captured into a CUDA graph (by a
    /// [`Capture`](batch::Batch) on another stream): ops outside the capture
    /// are refused until the capture ends.
    #[error(
        "the NCCL communicator is being captured into a CUDA graph; ops outside the capture \
         are refused until the capture ends (finish or drop the capture first)"
    )]
    Capturing,
    /// A non-blocking NCCL call did not finish in time.
    #[error("{what} did not finish within {after:?}")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        after: Duration,
    },
}

fn lib() -> Result<&'static Nccl, NcclCommError> {
    nccl_sys::nccl().map_err(|e| NcclCommError::Unavailable(e.to_string()))
}

fn nccl_err(nccl: &Nccl, call: &'static str, code: ncclResult_t) -> NcclCommError {
    let detail = match nccl.check(code) {
        Err(e) => e.to_string(),
        Ok(()) => "success".into(),
    };
    NcclCommError::Nccl {
        call,
        code: code.0,
        detail,
    }
}

/// A fresh NCCL unique id (what rank 0 of a communicator publishes).
///
/// # Errors
///
/// [`NcclCommError::Unavailable`] without NCCL; the NCCL error otherwise.
pub fn unique_id() -> Result<[u8; 128], NcclCommError> {
    let nccl = lib()?;
    let mut id = ncclUniqueId::zeroed();
    // SAFETY: `id` is a valid, writable ncclUniqueId.
    let rc = unsafe { (nccl.ncclGetUniqueId)(&mut id) };
    if !rc.is_success() {
        return Err(nccl_err(nccl, "ncclGetUniqueId", rc));
    }
    Ok(id.to_bytes())
}

/// Settings of new communicators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommOptions {
    /// Priority of the communicator's dedicated stream.
    pub priority: StreamPriority,
}

/// A communicator being created (non-blocking init or split): poll it until
/// it is ready. Dropping it unfinished aborts what was created.
pub struct PendingComm {
    nccl: &'static Nccl,
    /// Heap cell NCCL writes the new handle into (at a fixed address, as a
    /// non-blocking split writes it late).
    out: Box<ncclComm_t>,
    /// The parent of a split: its async error drives the split.
    parent: Option<Arc<Communicator>>,
    device: Device,
    nranks: usize,
    rank: usize,
    opts: CommOptions,
    started: Instant,
    done: bool,
}

// SAFETY: the raw handle in `out` is only an address NCCL writes once; NCCL
// communicators may be used from any thread (calls are serialized by the
// owner).
unsafe impl Send for PendingComm {}

impl fmt::Debug for PendingComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingComm")
            .field("device", &self.device.ordinal())
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("split", &self.parent.is_some())
            .finish()
    }
}

fn config() -> ncclConfig_t {
    let mut cfg = ncclConfig_t::initializer();
    cfg.blocking = 0;
    cfg
}

impl PendingComm {
    /// Starts `ncclCommInitRankConfig` (blocking = 0) for `rank` of `nranks`
    /// on `device` with the exchanged unique `id`.
    ///
    /// # Errors
    ///
    /// No NCCL or CUDA, bad ranks, or the NCCL error.
    pub fn init(
        device: &Device,
        nranks: usize,
        rank: usize,
        id: &[u8; 128],
        opts: CommOptions,
    ) -> Result<PendingComm, NcclCommError> {
        let nccl = lib()?;
        if rank >= nranks || nranks > c_int::MAX as usize {
            return Err(NcclCommError::InvalidArgument(format!(
                "rank {rank} is not in a communicator of {nranks} ranks"
            )));
        }
        let init = nccl.ncclCommInitRankConfig.ok_or_else(|| {
            NcclCommError::Unavailable(format!(
                "{} lacks ncclCommInitRankConfig (NCCL 2.14 or later is needed)",
                nccl.path()
            ))
        })?;
        device.bind_to_thread()?;
        let mut out = Box::new(std::ptr::null_mut());
        let mut cfg = config();
        let uid = ncclUniqueId::from_bytes(id);
        // SAFETY: `out` and `cfg` are valid for writes and outlive the call;
        // NCCL copies the config; `out` stays at its heap address until the
        // pending communicator is finished or dropped.
        let rc = unsafe { init(&mut *out, nranks as c_int, uid, rank as c_int, &mut cfg) };
        let mut p = PendingComm {
            nccl,
            out,
            parent: None,
            device: device.clone(),
            nranks,
            rank,
            opts,
            started: Instant::now(),
            done: false,
        };
        if !rc.is_success() && !rc.is_in_progress() {
            let e = nccl_err(nccl, "ncclCommInitRankConfig", rc);
            p.done = true;
            p.release();
            return Err(e);
        }
        Ok(p)
    }

    /// Starts a non-blocking `ncclCommSplit` of `parent`: `color` `None`
    /// takes part without joining (the result is then `None`).
    ///
    /// # Errors
    ///
    /// No split in this NCCL, an aborted parent, or the NCCL error.
    pub fn split(
        parent: &Arc<Communicator>,
        color: Option<u32>,
        key: usize,
        nranks: usize,
        rank: usize,
        opts: CommOptions,
    ) -> Result<PendingComm, NcclCommError> {
        let nccl = parent.nccl;
        let split = nccl.ncclCommSplit.ok_or_else(|| {
            NcclCommError::Unavailable(format!("{} lacks ncclCommSplit", nccl.path()))
        })?;
        let _g = parent.enqueue.lock().unwrap_or_else(|p| p.into_inner());
        let comm = parent.live()?;
        parent.device.bind_to_thread()?;
        let mut out = Box::new(std::ptr::null_mut());
        let mut cfg = config();
        let color = color.map_or(NCCL_SPLIT_NOCOLOR, |c| (c & 0x7fff_ffff) as c_int);
        // SAFETY: `comm` is a live communicator (we hold its enqueue lock);
        // `out` stays at its heap address until the split finishes (it is
        // written late, when polling the parent completes the job).
        let rc = unsafe { split(comm, color, key as c_int, &mut *out, &mut cfg) };
        if !rc.is_success() && !rc.is_in_progress() {
            return Err(nccl_err(nccl, "ncclCommSplit", rc));
        }
        Ok(PendingComm {
            nccl,
            out,
            parent: Some(parent.clone()),
            device: parent.device.clone(),
            nranks,
            rank,
            opts,
            started: Instant::now(),
            done: false,
        })
    }

    /// How long since the init or split started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Polls once (`ncclCommGetAsyncError`). `Ok(None)` while in progress;
    /// `Ok(Some(None))` for a split this rank did not join.
    ///
    /// # Errors
    ///
    /// The NCCL or CUDA error that ended the initialization.
    pub fn poll(&mut self) -> Result<Option<Option<Communicator>>, NcclCommError> {
        if self.done {
            return Err(NcclCommError::InvalidArgument(
                "the pending communicator was already finished".into(),
            ));
        }
        if let Some(parent) = &self.parent {
            // The split is a job of the parent.
            match parent.async_state() {
                Ok(true) => return Ok(None),
                Ok(false) => {}
                Err(e) => {
                    self.done = true;
                    return Err(e);
                }
            }
            if self.out.is_null() {
                self.done = true;
                return Ok(Some(None));
            }
        }
        let comm = *self.out;
        if comm.is_null() {
            return Ok(None);
        }
        let mut state = ncclResult_t::ncclSuccess;
        // SAFETY: `comm` is the handle NCCL wrote; polling its async error is
        // allowed while its initialization runs.
        let rc = unsafe { (self.nccl.ncclCommGetAsyncError)(comm, &mut state) };
        if !rc.is_success() {
            let e = nccl_err(self.nccl, "ncclCommGetAsyncError", rc);
            self.release();
            return Err(e);
        }
        if state.is_in_progress() {
            return Ok(None);
        }
        if !state.is_success() {
            let e = nccl_err(self.nccl, "ncclCommInitRankConfig", state);
            self.release();
            return Err(e);
        }
        self.done = true;
        match Communicator::wrap(
            self.nccl,
            comm,
            &self.device,
            self.rank,
            self.nranks,
            self.opts,
        ) {
            Ok(c) => {
                tracing::debug!(
                    device = self.device.ordinal(),
                    rank = self.rank,
                    nranks = self.nranks,
                    split = self.parent.is_some(),
                    "NCCL communicator ready"
                );
                Ok(Some(Some(c)))
            }
            Err(e) => {
                self.done = false;
                self.release();
                Err(e)
            }
        }
    }

    /// Aborts whatever NCCL created and marks this finished.
    fn release(&mut self) {
        self.done = true;
        let comm = std::mem::replace(&mut *self.out, std::ptr::null_mut());
        if !comm.is_null() {
            // SAFETY: `comm` is a handle NCCL created that nobody else owns.
            unsafe { (self.nccl.ncclCommAbort)(comm) };
        }
    }
}

impl Drop for PendingComm {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if self.parent.is_some() {
            // A split's handle may still be written by the parent's job:
            // leak the cell rather than let NCCL write into freed memory.
            let out = std::mem::replace(&mut self.out, Box::new(std::ptr::null_mut()));
            std::mem::forget(out);
            return;
        }
        self.release();
    }
}

struct EnqueueState {
    /// Input-ready events, re-recorded by every op (a stream wait captures
    /// the event's state at the call, so reuse is safe).
    ready: [Event; 2],
    /// Ops enqueued so far (their end events complete in this order).
    ops: u64,
}

/// A communicator's end events, each shared (`Arc`) with the ops that
/// use it. An event is free again once the pool holds its only handle (the
/// op's work, registry entry and retire-queue or reactor entry are gone):
/// reuse then needs neither an allocation nor a hand-back from the thread
/// that finished the op, and a stream wait captured before stays valid
/// when it is recorded anew. Scanned round-robin from where the last one was taken (ops finish
/// in stream order, so the next free one is usually the next one).
struct EventPool {
    events: Vec<Arc<EndEvent>>,
    next: usize,
}

/// Free events looked for before the pool grows.
const POOL_SCAN: usize = 8;
/// Beyond this many events in flight, an op's end event is its own.
const POOL_MAX: usize = 4096;

impl EventPool {
    /// A free event, or a new one (`create`) added to the pool.
    fn take(
        &mut self,
        create: impl FnOnce() -> Result<Event, CudaError>,
    ) -> Result<Arc<EndEvent>, CudaError> {
        let n = self.events.len();
        for k in 0..POOL_SCAN.min(n) {
            let i = (self.next + k) % n;
            // `get_mut` succeeds only on the sole handle, with acquire
            // ordering on the releases of the others.
            if Arc::get_mut(&mut self.events[i]).is_some() {
                self.next = (i + 1) % n;
                return Ok(self.events[i].clone());
            }
        }
        let ev = Arc::new(EndEvent { event: create()? });
        END_EVENTS_CREATED.fetch_add(1, Ordering::Relaxed);
        if n < POOL_MAX {
            // Insert at the scan position: it is taken now, and the events
            // after it are the ones most likely free next.
            let at = if n == 0 { 0 } else { self.next };
            self.events.insert(at, ev.clone());
            self.next = (at + 1) % (n + 1);
        }
        Ok(ev)
    }
}

/// An op's end event. It belongs to its communicator's pool, which records
/// it again for a later op once no handle on it is left.
pub struct EndEvent {
    event: Event,
}

impl fmt::Debug for EndEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("EndEvent").field(&self.event).finish()
    }
}

impl EndEvent {
    /// The event.
    pub fn event(&self) -> &Event {
        &self.event
    }
}

/// The watchdog asks an expired op's end event before it times the op out:
/// an op whose work nobody has polled yet may be finished already.
impl chorus_core::work::FinishedProbe for EndEvent {
    fn finished(&self) -> bool {
        let ev = self.event();
        // The watchdog thread may never have used the device.
        let bound = Device::get(ev.device()).and_then(|d| d.bind_to_thread());
        crate::cuda::relax_capture_mode();
        bound.is_ok() && matches!(ev.query(), Ok(true))
    }
}

/// One NCCL communicator with its dedicated stream.
pub struct Communicator {
    nccl: &'static Nccl,
    comm: AtomicPtr<nccl_sys::sys::ncclComm>,
    device: Device,
    stream: Stream,
    rank: usize,
    nranks: usize,
    /// Held while an op (or a split) is enqueued: NCCL communicators are not
    /// safe for concurrent calls.
    enqueue: Mutex<EnqueueState>,
    /// Its own lock: taken before the enqueue lock (the op's registry entry
    /// gets the event first), never by the threads that finish ops.
    pool: Mutex<EventPool>,
    /// Ops nobody waits for any more, retired by the threads that let go
    /// of them ([`retire`]).
    retire: Arc<RetireQueue>,
    aborted: AtomicBool,
    abort_reason: Mutex<Option<String>>,
    /// Signals when the abort thread's `ncclCommAbort` returned; the drop
    /// waits for it (bounded), so a process that exits right after an
    /// abort does not tear NCCL down under a running abort.
    abort_done: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    /// Set while the stream takes part in a CUDA graph capture.
    capturing: AtomicBool,
}

// SAFETY: the raw handle is used under `enqueue` for ops, and otherwise only
// with the calls NCCL documents as callable concurrently
// (ncclCommGetAsyncError, ncclCommAbort).
unsafe impl Send for Communicator {}
// SAFETY: as above.
unsafe impl Sync for Communicator {}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator")
            .field("device", &self.device.ordinal())
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("aborted", &self.is_aborted())
            .finish()
    }
}

/// The op a [`Communicator::submit`] enqueues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommOp {
    /// In place on buffer 0.
    AllReduce(NcclRedOp),
    /// In place on buffer 0, from `root`.
    Broadcast {
        /// The root rank.
        root: usize,
    },
    /// In place on buffer 0; the result lands on `root`.
    Reduce {
        /// The root rank.
        root: usize,
        /// The reduction.
        op: NcclRedOp,
    },
    /// Buffer 0 (count c) into buffer 1 (count nranks × c).
    AllGather,
    /// Buffer 0 (count nranks × c) into buffer 1 (count c).
    ReduceScatter(NcclRedOp),
    /// Buffer 0 block j to rank j; block i of buffer 1 from rank i (grouped
    /// send/recv).
    AllToAll,
    /// Sends buffer 0 to `peer`.
    Send {
        /// The peer's rank in this communicator.
        peer: usize,
    },
    /// Receives into buffer 0 from `peer`.
    Recv {
        /// The peer's rank in this communicator.
        peer: usize,
    },
    /// Sends buffer 0 to and receives buffer 1 from `peer`, grouped (the
    /// peer may be this rank).
    SendRecv {
        /// The peer's rank in this communicator.
        peer: usize,
    },
}

impl CommOp {
    fn buffers(self) -> usize {
        match self {
            CommOp::AllReduce(_)
            | CommOp::Broadcast { .. }
            | CommOp::Reduce { .. }
            | CommOp::Send { .. }
            | CommOp::Recv { .. } => 1,
            CommOp::AllGather
            | CommOp::ReduceScatter(_)
            | CommOp::AllToAll
            | CommOp::SendRecv { .. } => 2,
        }
    }
}

/// An op with its buffers reduced to addresses, counts and a type: what
/// [`Communicator::issue`] hands NCCL.
#[derive(Clone, Copy, Debug)]
struct RawOp {
    op: CommOp,
    ty: NcclType,
    p0: *mut std::ffi::c_void,
    c0: usize,
    p1: *mut std::ffi::c_void,
    c1: usize,
}

impl RawOp {
    /// `bufs` has one or two buffers (checked by [`Communicator::check`]).
    fn new<B: DeviceMem>(op: CommOp, bufs: &[B]) -> RawOp {
        let ptr = |b: Option<&B>| {
            b.map_or(std::ptr::null_mut(), |b| {
                b.device_ptr() as *mut std::ffi::c_void
            })
        };
        RawOp {
            op,
            ty: bufs.first().map_or(NcclType::U8, |b| b.nccl_type()),
            p0: ptr(bufs.first()),
            c0: bufs.first().map_or(0, |b| b.count()),
            p1: ptr(bufs.get(1)),
            c1: bufs.get(1).map_or(0, |b| b.count()),
        }
    }
}

/// A refused submission: the error and the untouched buffers.
pub type Refused<B> = (NcclCommError, Vec<B>);

impl Communicator {
    /// Wraps a ready NCCL handle with its own stream and events.
    fn wrap(
        nccl: &'static Nccl,
        comm: ncclComm_t,
        device: &Device,
        rank: usize,
        nranks: usize,
        opts: CommOptions,
    ) -> Result<Communicator, NcclCommError> {
        let stream = device.new_stream(opts.priority)?;
        let ready = [device.new_event()?, device.new_event()?];
        Ok(Communicator {
            nccl,
            comm: AtomicPtr::new(comm),
            device: device.clone(),
            stream,
            rank,
            nranks,
            enqueue: Mutex::new(EnqueueState { ready, ops: 0 }),
            pool: Mutex::new(EventPool {
                events: Vec::new(),
                next: 0,
            }),
            retire: Arc::default(),
            aborted: AtomicBool::new(false),
            abort_reason: Mutex::new(None),
            abort_done: Mutex::new(None),
            capturing: AtomicBool::new(false),
        })
    }

    /// A *blocking* communicator of the same ranks split from this one
    /// (`ncclCommSplit` with `blocking = 1`), with its own stream. Op calls
    /// on a blocking communicator return once the op is enqueued, without
    /// the `ncclInProgress` polling a non-blocking one needs on every call
    /// (60–190 µs per op on 2 GPUs). chorus creates communicators
    /// non-blocking (so initialization has a timeout and can be aborted) and
    /// then switches to a blocking twin for ops.
    ///
    /// Every rank must call it. It blocks the calling thread until every
    /// rank did; aborting this communicator from another thread ends the
    /// wait with an error.
    ///
    /// # Errors
    ///
    /// No `ncclCommSplit` in this NCCL, an aborted communicator, or the NCCL
    /// or CUDA error.
    pub fn split_blocking(&self, opts: CommOptions) -> Result<Communicator, NcclCommError> {
        let split = self.nccl.ncclCommSplit.ok_or_else(|| {
            NcclCommError::Unavailable(format!("{} lacks ncclCommSplit", self.nccl.path()))
        })?;
        // A heap cell NCCL writes the new handle into, possibly late (the
        // parent is non-blocking): leaked if we give up before it is done.
        let mut cell: Box<ncclComm_t> = Box::new(std::ptr::null_mut());
        {
            let _g = self.enqueue.lock().unwrap_or_else(|p| p.into_inner());
            let comm = self.live()?;
            self.device.bind_to_thread()?;
            let mut cfg = ncclConfig_t::initializer();
            cfg.blocking = 1;
            // SAFETY: `comm` is live and we hold its enqueue lock; `cell`
            // stays at its heap address until the split is done (or is
            // leaked); NCCL copies `cfg`.
            let rc = unsafe { split(comm, 0, self.rank as c_int, &mut *cell, &mut cfg) };
            if !rc.is_success() && !rc.is_in_progress() {
                return Err(nccl_err(self.nccl, "ncclCommSplit", rc));
            }
            // The parent is non-blocking: the split completes as its job.
            if let Err(e) = self.wait_idle("ncclCommSplit", Duration::from_secs(3600)) {
                std::mem::forget(cell);
                return Err(e);
            }
        }
        let out = *cell;
        if out.is_null() {
            return Err(NcclCommError::InvalidArgument(
                "ncclCommSplit returned no communicator".into(),
            ));
        }
        Communicator::wrap(self.nccl, out, &self.device, self.rank, self.nranks, opts).inspect_err(
            |_| {
                // SAFETY: `out` is the new handle nobody else holds.
                unsafe { (self.nccl.ncclCommAbort)(out) };
            },
        )
    }

    /// This rank in the communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The dedicated stream ops run on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// True once aborted.
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    fn live(&self) -> Result<ncclComm_t, NcclCommError> {
        if self.is_aborted() {
            let why = self
                .abort_reason
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .unwrap_or_default();
            return Err(NcclCommError::Aborted(why));
        }
        Ok(self.comm.load(Ordering::Acquire))
    }

    /// [`live`](Self::live), and not taking part in a graph capture (its
    /// stream would capture the op).
    fn live_outside_capture(&self) -> Result<ncclComm_t, NcclCommError> {
        let comm = self.live()?;
        if self.capturing.load(Ordering::Acquire) {
            return Err(NcclCommError::Capturing);
        }
        Ok(comm)
    }

    /// `ncclCommGetAsyncError`: `Ok(true)` while a non-blocking call is in
    /// progress, `Ok(false)` when idle and healthy.
    ///
    /// # Errors
    ///
    /// The communicator's asynchronous error (a failed peer, a network
    /// error), or [`NcclCommError::Aborted`].
    pub fn async_state(&self) -> Result<bool, NcclCommError> {
        let comm = self.live()?;
        let mut state = ncclResult_t::ncclSuccess;
        // SAFETY: `comm` is live (not aborted); this call is allowed
        // concurrently with others on the communicator.
        let rc = unsafe { (self.nccl.ncclCommGetAsyncError)(comm, &mut state) };
        if !rc.is_success() {
            return Err(nccl_err(self.nccl, "ncclCommGetAsyncError", rc));
        }
        if state.is_in_progress() {
            return Ok(true);
        }
        if !state.is_success() {
            return Err(nccl_err(
                self.nccl,
                "NCCL communicator (async error)",
                state,
            ));
        }
        Ok(false)
    }

    /// Aborts the communicator (`ncclCommAbort`): its ops in flight stop, and
    /// every later use fails with [`NcclCommError::Aborted`]. Idempotent.
    pub fn abort(&self, reason: &str) {
        if self.aborted.swap(true, Ordering::AcqRel) {
            return;
        }
        *self.abort_reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.to_string());
        let comm = self.comm.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !comm.is_null() {
            tracing::warn!(
                device = self.device.ordinal(),
                reason,
                "aborting NCCL communicator"
            );
            // ncclCommAbort can block until the communicator's stream drains
            // (e.g. behind a producer stream that never completes): run it
            // on its own thread so the caller (a timed-out blocking wait, the
            // watchdog) returns at once. The communicator is already unusable.
            struct Raw(ncclComm_t, &'static Nccl);
            // SAFETY: the handle is owned by this value alone from here on.
            unsafe impl Send for Raw {}
            let raw = Raw(comm, self.nccl);
            let (tx, rx) = std::sync::mpsc::channel();
            let run = move || {
                let raw = raw;
                // SAFETY: `raw.0` is live and no longer reachable through
                // the communicator; ncclCommAbort may be called while other
                // threads are inside NCCL calls on it.
                unsafe { (raw.1.ncclCommAbort)(raw.0) };
                let _ = tx.send(());
            };
            match std::thread::Builder::new()
                .name("chorus-nccl-abort".into())
                .spawn(run)
            {
                Ok(_) => *self.abort_done.lock().unwrap_or_else(|p| p.into_inner()) = Some(rx),
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the NCCL abort thread; the communicator is leaked")
                }
            }
        }
    }

    /// A free end event from the pool (see [`EventPool`]).
    fn end_event(&self) -> Result<Arc<EndEvent>, CudaError> {
        self.pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(|| self.device.new_event())
    }

    fn check(&self, op: CommOp, bufs: &[impl DeviceMem]) -> Result<(), NcclCommError> {
        let bad = |m: String| Err(NcclCommError::InvalidArgument(m));
        if bufs.len() != op.buffers() {
            return bad(format!(
                "{op:?} takes {} buffer(s), got {}",
                op.buffers(),
                bufs.len()
            ));
        }
        let dev = self.device.ordinal();
        for b in bufs {
            if b.stream().device().ordinal() != dev {
                return bad(format!(
                    "a buffer is on device {} but the communicator on device {dev}",
                    b.stream().device().ordinal()
                ));
            }
            if b.nccl_type() != bufs[0].nccl_type() {
                return bad(format!(
                    "buffers of different types ({:?} and {:?})",
                    bufs[0].nccl_type(),
                    b.nccl_type()
                ));
            }
        }
        let n = self.nranks;
        let in_range = |r: usize, what: &str| {
            if r >= n {
                Err(NcclCommError::InvalidArgument(format!(
                    "{what} {r} is not a rank of a communicator of {n}"
                )))
            } else {
                Ok(())
            }
        };
        match op {
            CommOp::Broadcast { root } | CommOp::Reduce { root, .. } => in_range(root, "root")?,
            CommOp::Send { peer } | CommOp::Recv { peer } => in_range(peer, "peer")?,
            CommOp::SendRecv { peer } => {
                in_range(peer, "peer")?;
                if bufs[0].count() != bufs[1].count() {
                    return bad(format!(
                        "send_recv buffers have {} and {} elements; they must match",
                        bufs[0].count(),
                        bufs[1].count()
                    ));
                }
            }
            CommOp::AllGather if bufs[1].count() != bufs[0].count() * n => {
                return bad(format!(
                    "all_gather output has {} elements; expected {n} × {}",
                    bufs[1].count(),
                    bufs[0].count()
                ))
            }
            CommOp::ReduceScatter(_) if bufs[0].count() != bufs[1].count() * n => {
                return bad(format!(
                    "reduce_scatter input has {} elements; expected {n} × {}",
                    bufs[0].count(),
                    bufs[1].count()
                ))
            }
            CommOp::AllToAll if bufs[0].count() != bufs[1].count() || bufs[0].count() % n != 0 => {
                return bad(format!(
                    "all_to_all buffers have {} and {} elements; both must be the same multiple of {n}",
                    bufs[0].count(),
                    bufs[1].count()
                ))
            }
            _ => {}
        }
        Ok(())
    }

    /// Enqueues `op` on `bufs` (DESIGN §2 rule 3): records an input-ready
    /// event on each buffer's producer stream, makes the communicator's
    /// stream wait on it, calls NCCL, records the end event. Calls on one
    /// communicator are serialized. Returns at once; the op runs on the GPU.
    ///
    /// # Errors
    ///
    /// The buffers come back untouched with the error when the arguments do
    /// not fit, the communicator is aborted, or a CUDA or NCCL call fails.
    pub fn submit<B: DeviceMem>(
        &self,
        op: CommOp,
        bufs: Vec<B>,
    ) -> Result<InFlight<B>, Refused<B>> {
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
    pub fn submit_with_end<B: DeviceMem>(
        &self,
        op: CommOp,
        bufs: Vec<B>,
        end: Option<Arc<EndEvent>>,
    ) -> Result<InFlight<B>, Refused<B>> {
        if let Err(e) = self.check(op, &bufs) {
            return Err((e, bufs));
        }
        let end = match end.map_or_else(|| self.reserve_end_event(), Ok) {
            Ok(e) => e,
            Err(e) => return Err((e.into(), bufs)),
        };
        let mut guard = self.enqueue.lock().unwrap_or_else(|p| p.into_inner());
        let prof = chorus_core::profile::on();
        if prof {
            chorus_core::profile::stamp(5);
        }
        match self.enqueue_locked(&guard, op, &bufs, &end) {
            Ok(()) => {
                if prof {
                    chorus_core::profile::stamp(6);
                }
                guard.ops += 1;
                let pos = guard.ops;
                drop(guard);
                Ok(InFlight {
                    device: self.device.clone(),
                    order: (self.stream.as_raw() as u64, pos),
                    end,
                    bufs: Some(bufs),
                    retire: Some(self.retire.clone()),
                })
            }
            Err(e) => Err((e, bufs)),
        }
    }

    fn enqueue_locked<B: DeviceMem>(
        &self,
        st: &EnqueueState,
        op: CommOp,
        bufs: &[B],
        end: &EndEvent,
    ) -> Result<(), NcclCommError> {
        let comm = self.live_outside_capture()?;
        // One context bind for the op's driver calls.
        self.device.bind_to_thread()?;
        // Input-ready: the comm stream waits for the producers.
        st.ready[0].record_bound(bufs[0].stream())?;
        self.stream.wait_event_bound(&st.ready[0])?;
        if bufs.len() > 1 && bufs[1].stream().as_raw() != bufs[0].stream().as_raw() {
            st.ready[1].record_bound(bufs[1].stream())?;
            self.stream.wait_event_bound(&st.ready[1])?;
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
    fn settle(&self, call: &'static str, rc: ncclResult_t) -> Result<(), NcclCommError> {
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
    unsafe fn issue(&self, comm: ncclComm_t, raw: &RawOp) -> (&'static str, ncclResult_t) {
        let s = self.stream.as_raw() as cudaStream_t;
        let n = self.nccl;
        let (ty, p0, c0, p1, c1) = (raw.ty.raw(), raw.p0, raw.c0, raw.p1, raw.c1);
        // On one rank the average is the sum; NCCL 2.28.3's one-rank
        // average path (a scaling kernel) was seen to leave the last element
        // of an odd-length f64 reduce_scatter unwritten on an H200.
        let red = |r: NcclRedOp| match r {
            NcclRedOp::Avg if self.nranks == 1 => NcclRedOp::Sum.raw(),
            r => r.raw(),
        };
        let ok = |rc: ncclResult_t| rc.is_success() || rc.is_in_progress();
        // SAFETY: the caller's contract covers every pointer, count and the
        // communicator; nested group calls are allowed by NCCL.
        unsafe {
            match raw.op {
                CommOp::AllReduce(r) => (
                    "ncclAllReduce",
                    (n.ncclAllReduce)(p0, p0, c0, ty, red(r), comm, s),
                ),
                CommOp::Broadcast { root } => (
                    "ncclBroadcast",
                    (n.ncclBroadcast)(p0, p0, c0, ty, root as c_int, comm, s),
                ),
                CommOp::Reduce { root, op } => (
                    "ncclReduce",
                    (n.ncclReduce)(p0, p0, c0, ty, red(op), root as c_int, comm, s),
                ),
                CommOp::AllGather => ("ncclAllGather", (n.ncclAllGather)(p0, p1, c0, ty, comm, s)),
                CommOp::ReduceScatter(r) => (
                    "ncclReduceScatter",
                    (n.ncclReduceScatter)(p0, p1, c1, ty, red(r), comm, s),
                ),
                CommOp::Send { peer } => {
                    ("ncclSend", (n.ncclSend)(p0, c0, ty, peer as c_int, comm, s))
                }
                CommOp::Recv { peer } => {
                    ("ncclRecv", (n.ncclRecv)(p0, c0, ty, peer as c_int, comm, s))
                }
                CommOp::SendRecv { peer } => {
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
                CommOp::AllToAll => {
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

    /// Polls `ncclCommGetAsyncError` until no call is in progress.
    fn wait_idle(&self, what: &'static str, limit: Duration) -> Result<(), NcclCommError> {
        // Spin first: an op call that returned ncclInProgress is usually
        // done within microseconds, and a sleep costs ~50 µs of timer slack
        // (measured on 2 GPUs: 80-190 µs per op with sleeps alone). Then
        // yield, then sleep with backoff for long waits (init, split).
        const SPIN: Duration = Duration::from_micros(200);
        const YIELD: Duration = Duration::from_millis(2);
        let t0 = Instant::now();
        let mut pause = Duration::from_micros(10);
        while self.async_state()? {
            let waited = t0.elapsed();
            if waited > limit {
                return Err(NcclCommError::Timeout { what, after: limit });
            }
            if waited < SPIN {
                std::hint::spin_loop();
            } else if waited < YIELD {
                std::thread::yield_now();
            } else {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
            }
        }
        Ok(())
    }
}

/// How many NCCL op calls returned `ncclInProgress` (process-wide): each
/// then costs `ncclCommGetAsyncError` polls before the end event is
/// recorded.
pub fn in_progress_returns() -> u64 {
    IN_PROGRESS.load(Ordering::Relaxed)
}

static IN_PROGRESS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many end events the communicators' pools have created
/// (process-wide): a pool grows to the most ops it has had in flight at
/// once.
pub fn end_events_created() -> u64 {
    END_EVENTS_CREATED.load(Ordering::Relaxed)
}

static END_EVENTS_CREATED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How long dropping an aborted communicator waits for its abort to finish.
const ABORT_JOIN_LIMIT: Duration = Duration::from_secs(10);

impl Drop for Communicator {
    fn drop(&mut self) {
        if let Some(rx) = self
            .abort_done
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            if rx.recv_timeout(ABORT_JOIN_LIMIT).is_err() {
                tracing::error!(
                    device = self.device.ordinal(),
                    limit = ?ABORT_JOIN_LIMIT,
                    "ncclCommAbort has not returned; leaving it running"
                );
            }
        }
        let comm = self.comm.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if comm.is_null() {
            return;
        }
        // Let the GPU finish what was enqueued, then finalize and destroy.
        let _ = self.stream.synchronize();
        let clean = match self.nccl.ncclCommFinalize {
            Some(fin) => {
                // SAFETY: `comm` is live and exclusively ours (we are being
                // dropped).
                let rc = unsafe { fin(comm) };
                let mut ok = rc.is_success() || rc.is_in_progress();
                let t0 = Instant::now();
                while ok {
                    let mut st = ncclResult_t::ncclSuccess;
                    // SAFETY: as above.
                    let rc = unsafe { (self.nccl.ncclCommGetAsyncError)(comm, &mut st) };
                    if !rc.is_success() || !(st.is_success() || st.is_in_progress()) {
                        ok = false;
                    } else if st.is_success() {
                        break;
                    } else if t0.elapsed() > Duration::from_secs(10) {
                        ok = false;
                    } else {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }
                ok
            }
            None => true,
        };
        // SAFETY: `comm` is exclusively ours; after either call it is gone.
        unsafe {
            if clean {
                (self.nccl.ncclCommDestroy)(comm);
            } else {
                (self.nccl.ncclCommAbort)(comm);
            }
        }
    }
}

/// An enqueued op: its end event and buffers.
///
/// The buffers are released only after the end event completes: through
/// [`watch`](Self::watch), [`wait`](Self::wait), [`detach`](Self::detach),
/// or — when dropped unfinished — as `detach` does.
pub struct InFlight<B: DeviceMem> {
    device: Device,
    /// (comm stream, op number on it): end events complete in this order.
    order: (u64, u64),
    end: Arc<EndEvent>,
    bufs: Option<Vec<B>>,
    /// Where [`detach`](Self::detach) leaves the op: its communicator's
    /// retire queue, else the reactor.
    retire: Option<Arc<RetireQueue>>,
}

impl<B: DeviceMem> fmt::Debug for InFlight<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight").field("end", &self.end).finish()
    }
}

/// What a watched op's callback receives: the buffers (unless they were
/// taken early by a stream-ordered wait), or the CUDA error that ended it
/// with the buffers to release.
pub type Finished<B> = (Result<(), CudaError>, Option<Vec<B>>);

impl<B: DeviceMem> InFlight<B> {
    /// The end event.
    pub fn end_event(&self) -> &Event {
        self.end.event()
    }

    /// Blocks until the end event completes and returns the buffers. For
    /// tests and sync code.
    ///
    /// # Errors
    ///
    /// The CUDA error of the op; the buffers are then leaked only if the
    /// device is unusable (never freed while the GPU may use them).
    pub fn wait(mut self) -> Result<Vec<B>, CudaError> {
        self.end.event().synchronize()?;
        Ok(self.bufs.take().unwrap_or_default())
    }

    /// A shared handle on the end event.
    pub fn end_event_handle(&self) -> Arc<EndEvent> {
        self.end.clone()
    }

    /// Makes the op's device current on the calling thread.
    ///
    /// # Errors
    ///
    /// The CUDA error of binding the device's context.
    pub fn bind_device(&self) -> Result<(), CudaError> {
        self.device.bind_to_thread()
    }

    /// GpuFinished without the reactor: if the end event has completed,
    /// takes the buffers. `Ok(None)` while the op runs, or when they were
    /// taken before. The op's device must be current (see
    /// [`bind_device`](Self::bind_device)).
    ///
    /// # Errors
    ///
    /// The CUDA error of the event query (an error of the op).
    pub fn take_finished(&mut self) -> Result<Option<Vec<B>>, CudaError> {
        if self.bufs.is_none() || !self.end.event().query()? {
            return Ok(None);
        }
        Ok(self.bufs.take())
    }

    /// Stream-ordered completion, as [`Watched::take_stream_ordered`].
    ///
    /// # Errors
    ///
    /// The CUDA error of a stream wait; the buffers stay with the op.
    pub fn take_stream_ordered(
        &mut self,
        stream: Option<&Stream>,
    ) -> Result<Option<Vec<B>>, CudaError> {
        let Some(bufs) = self.bufs.as_deref() else {
            return Ok(None);
        };
        order_after(self.end.event(), stream, bufs)?;
        Ok(self.bufs.take())
    }

    /// Hands the op to the completion reactor: `done` runs on the reactor
    /// thread once the end event completed (or failed). The returned handle
    /// can take the buffers early with a stream-ordered wait.
    pub fn watch<F>(self, done: F) -> Watched<B>
    where
        F: FnOnce(Finished<B>) + Send + 'static,
    {
        let (watched, entry) = self.into_entry(done);
        register_or_wait(Box::new(entry));
        watched
    }

    /// Lets go of an op nobody waits for: `done` runs once the end event
    /// completed (or failed), with the buffers still held, if any. An op of
    /// a communicator goes to its retire queue: a later op let go of on
    /// the communicator runs `done` on its own thread, or the queue's
    /// sweeper on the reactor thread does once nobody lets go of more (see
    /// the `retire` module). Otherwise the reactor watches it as a
    /// detached entry (checked every
    /// [`detached_poll`](crate::reactor::ReactorConfig::detached_poll), no
    /// wake-up).
    pub fn detach<F>(mut self, done: F)
    where
        F: FnOnce(Finished<B>) + Send + 'static,
    {
        let entry = Detached {
            order: self.order,
            device: self.device.clone(),
            end: self.end.clone(),
            bufs: self.bufs.take(),
            done: Some(done),
        };
        if let Some(q) = self.retire.take() {
            q.push(Box::new(entry));
            return;
        }
        if let Err((e, mut entry)) = reactor::global().register_detached(Box::new(entry)) {
            tracing::error!(error = %e, "no completion reactor; waiting on the GPU inline");
            while !entry.poll_complete() {
                std::thread::yield_now();
            }
        }
    }

    /// Like [`watch`](Self::watch), but the reactor entry goes into `set`,
    /// which registers the entries of ops sharing one end event (a group)
    /// as one.
    pub fn watch_in<F>(self, done: F, set: &mut WatchSet) -> Watched<B>
    where
        F: FnOnce(Finished<B>) + Send + 'static,
    {
        let (watched, entry) = self.into_entry(done);
        set.entries.push(Box::new(entry));
        watched
    }

    fn into_entry<F>(mut self, done: F) -> (Watched<B>, Entry<B, F>)
    where
        F: FnOnce(Finished<B>) + Send + 'static,
    {
        let cell = Arc::new(Cell {
            end: self.end.clone(),
            bufs: Mutex::new(self.bufs.take()),
        });
        let entry = Entry {
            order: self.order,
            device: self.device.clone(),
            cell: cell.clone(),
            done: Some(done),
        };
        (Watched { cell }, entry)
    }
}

/// Hands `entry` to the completion reactor; without a reactor thread, waits
/// for it here.
fn register_or_wait(entry: Box<dyn Pending>) {
    if let Err((e, mut entry)) = reactor::global().register(entry) {
        // No reactor thread: complete synchronously (the GPU wait happens
        // here instead of in the background).
        tracing::error!(error = %e, "no completion reactor; waiting on the GPU inline");
        while !entry.poll_complete() {
            std::thread::yield_now();
        }
    }
}

/// Reactor entries of ops that share one end event (the ops of a group),
/// registered as one entry by [`register`](Self::register): one hand-off
/// to the reactor and one event query per round for the whole group.
#[derive(Default)]
pub struct WatchSet {
    entries: Vec<Box<dyn Pending>>,
}

impl fmt::Debug for WatchSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchSet")
            .field("entries", &self.entries.len())
            .finish()
    }
}

impl WatchSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Hands the set's entries to the completion reactor as one entry.
    pub fn register(self) {
        if !self.entries.is_empty() {
            register_or_wait(Box::new(self));
        }
    }
}

impl Pending for WatchSet {
    fn order(&self) -> Option<(u64, u64)> {
        self.entries.first().and_then(|e| e.order())
    }

    fn poll_complete(&mut self) -> bool {
        // The first entry's event is every entry's: once it completed the
        // others complete in the same round.
        let Some(first) = self.entries.first_mut() else {
            return true;
        };
        if !first.poll_complete() {
            return false;
        }
        self.entries.remove(0);
        self.entries.retain_mut(|e| !e.poll_complete());
        self.entries.is_empty()
    }
}

impl<B: DeviceMem> Drop for InFlight<B> {
    fn drop(&mut self) {
        if let Some(bufs) = self.bufs.take() {
            if matches!(self.end.event().query(), Ok(true)) {
                return;
            }
            // Unfinished: the communicator's retire queue (or the reactor)
            // keeps the buffers until the GPU is done.
            let f = InFlight {
                device: self.device.clone(),
                order: self.order,
                end: self.end.clone(),
                bufs: Some(bufs),
                retire: self.retire.take(),
            };
            f.detach(|_| {});
        }
    }
}

struct Cell<B> {
    end: Arc<EndEvent>,
    bufs: Mutex<Option<Vec<B>>>,
}

struct Entry<B: DeviceMem, F> {
    order: (u64, u64),
    device: Device,
    cell: Arc<Cell<B>>,
    done: Option<F>,
}

impl<B: DeviceMem, F: FnOnce(Finished<B>) + Send + 'static> Pending for Entry<B, F> {
    fn order(&self) -> Option<(u64, u64)> {
        Some(self.order)
    }

    fn poll_complete(&mut self) -> bool {
        let Some(outcome) = end_outcome(&self.device, &self.cell.end, true) else {
            return false;
        };
        let bufs = self
            .cell
            .bufs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(done) = self.done.take() {
            done((outcome, bufs));
        }
        true
    }
}

/// Queries an op's end event (`on_reactor`: from the reactor thread):
/// `None` while it runs, else how it ended.
fn end_outcome(device: &Device, end: &EndEvent, on_reactor: bool) -> Option<Result<(), CudaError>> {
    // The querying thread may hold another device's context: make the
    // event's current (cheap when it already is).
    let _ = device.bind_to_thread();
    // The reactor's own thread may relax its capture mode; a caller's
    // thread keeps the mode its owner chose.
    if on_reactor {
        crate::cuda::relax_capture_mode();
    }
    match end.event().query() {
        Ok(false) => None,
        Ok(true) => Some(Ok(())),
        Err(e) => Some(Err(e)),
    }
}

/// A watched op (see [`InFlight::watch`]).
pub struct Watched<B: DeviceMem> {
    cell: Arc<Cell<B>>,
}

impl<B: DeviceMem> fmt::Debug for Watched<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watched")
            .field("end", &self.cell.end)
            .finish()
    }
}

impl<B: DeviceMem> Watched<B> {
    /// The end event.
    pub fn end_event(&self) -> &Event {
        self.cell.end.event()
    }

    /// GpuFinished without the reactor: if the end event has completed,
    /// takes the buffers. `Ok(None)` while the op runs, or when the buffers
    /// are gone already (taken before, or handed to the completion
    /// callback, which then completes the work). On a thread that may never
    /// have used the op's device, call [`bind_device`](Self::bind_device)
    /// once first.
    ///
    /// # Errors
    ///
    /// The CUDA error of the event query (the reactor reports it too).
    pub fn take_finished(&self) -> Result<Option<Vec<B>>, CudaError> {
        let mut g = self.cell.bufs.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() || !self.cell.end.event().query()? {
            return Ok(None);
        }
        Ok(g.take())
    }

    /// Makes the op's device current on the calling thread (a no-op when
    /// the buffers are gone already).
    ///
    /// # Errors
    ///
    /// The CUDA error of binding the device's context.
    pub fn bind_device(&self) -> Result<(), CudaError> {
        let g = self.cell.bufs.lock().unwrap_or_else(|p| p.into_inner());
        match g.as_ref().and_then(|b| b.first()) {
            Some(first) => first.stream().device().bind_to_thread(),
            None => Ok(()),
        }
    }

    /// A shared handle on the end event (e.g. for another thread to watch).
    pub fn end_event_handle(&self) -> Arc<EndEvent> {
        self.cell.end.clone()
    }

    /// Stream-ordered completion: makes `stream` (default: each buffer's own
    /// producer stream) wait on the end event and takes the buffers at once,
    /// without a host wait. When `stream` is another stream, each buffer's
    /// producer stream waits too, so freeing a buffer on its own stream is
    /// ordered after the op. `Ok(None)` if the buffers are gone already
    /// (taken before, or handed to the completion callback).
    ///
    /// # Errors
    ///
    /// The CUDA error of a stream wait; the buffers stay with the op.
    pub fn take_stream_ordered(
        &self,
        stream: Option<&Stream>,
    ) -> Result<Option<Vec<B>>, CudaError> {
        let mut g = self.cell.bufs.lock().unwrap_or_else(|p| p.into_inner());
        let Some(bufs) = g.as_ref() else {
            return Ok(None);
        };
        order_after(self.cell.end.event(), stream, bufs)?;
        Ok(g.take())
    }
}

/// Makes `stream` (if any) and each buffer's producer stream wait on `ev`,
/// each stream once.
fn order_after<B: DeviceMem>(
    ev: &Event,
    stream: Option<&Stream>,
    bufs: &[B],
) -> Result<(), CudaError> {
    if let Some(s) = stream {
        s.wait_event(ev)?;
    }
    for (i, b) in bufs.iter().enumerate() {
        let raw = b.stream().as_raw();
        let seen = stream.is_some_and(|s| s.as_raw() == raw)
            || bufs[..i].iter().any(|p| p.stream().as_raw() == raw);
        if !seen {
            b.stream().wait_event(ev)?;
        }
    }
    Ok(())
}
