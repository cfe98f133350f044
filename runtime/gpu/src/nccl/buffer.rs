//! The device memory an NCCL op reads and writes: the open [`DeviceMem`]
//! trait, chorus's own [`DeviceBuffer`], and [`RawDeviceBuffer`] for memory
//! that only a raw pointer describes.

use std::fmt;

use chorus_core::{DType, Element};
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};

use crate::cuda::{CudaError, Device, Event, Stream};

/// Device memory an NCCL op may read and write, handed to chorus by value.
///
/// An op takes the buffer by value and gives it back through its work once
/// the op is done (or in the error that refused it), so the value is what
/// keeps the memory alive: chorus drops a buffer only after the op's end
/// event has completed, also when the work is dropped or leaked. Implement
/// it for the buffer type of another library (a tensor's storage) to run
/// chorus ops on it directly.
///
/// # Safety
///
/// For as long as the value lives, an implementor promises that:
///
/// * [`device_ptr`](Self::device_ptr) is the start of one allocation of at
///   least [`count`](Self::count) × [`dtype`](Self::dtype)`.size()` bytes,
///   on the device of [`stream`](Self::stream), and these three answers do
///   not change;
/// * the memory stays allocated, and is not freed or reused by anyone
///   else, until the value is dropped (dropping it may free the memory:
///   chorus drops it only once no GPU work of its own touches it);
/// * [`stream`](Self::stream) is the stream that produces the data, and
///   work that reads or writes the memory outside chorus is ordered on that
///   stream (or after it): chorus makes the op wait for the work issued to
///   it before the op, and hands the buffer back ordered after the op on it
///   (stream-ordered) or after the GPU finished the op.
///
/// A type that breaks these rules lets NCCL read or write memory it does
/// not own.
pub unsafe trait DeviceMem: Send + 'static {
    /// Start address of the memory on the device.
    fn device_ptr(&self) -> u64;
    /// Number of elements.
    fn count(&self) -> usize;
    /// Element type.
    fn dtype(&self) -> DType;
    /// The stream that produces (and later consumes) the data; its device
    /// is the buffer's device.
    fn stream(&self) -> &Stream;
}

/// The buffers of one op, as it takes them and gives them back: one
/// buffer (`B`), an input and an output (`(B, B)`), or a list (`Vec<B>`,
/// a coalesced op). An op holds them whole until it is done, so nothing
/// is allocated to carry them and a refusal gives them back as they came.
pub trait DeviceBuffers: Send + 'static {
    /// The buffer type.
    type Buf: DeviceMem;
    /// Number of buffers.
    fn len(&self) -> usize;
    /// True if there is no buffer.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Buffer `i`, in the op's order (input first).
    fn get(&self, i: usize) -> Option<&Self::Buf>;
    /// Every buffer, in order.
    fn iter(&self) -> impl Iterator<Item = &Self::Buf> {
        (0..self.len()).filter_map(move |i| self.get(i))
    }
}

impl<B: DeviceMem> DeviceBuffers for B {
    type Buf = B;
    fn len(&self) -> usize {
        1
    }
    fn get(&self, i: usize) -> Option<&B> {
        (i == 0).then_some(self)
    }
}

impl<B: DeviceMem> DeviceBuffers for (B, B) {
    type Buf = B;
    fn len(&self) -> usize {
        2
    }
    fn get(&self, i: usize) -> Option<&B> {
        match i {
            0 => Some(&self.0),
            1 => Some(&self.1),
            _ => None,
        }
    }
}

impl<B: DeviceMem> DeviceBuffers for Vec<B> {
    type Buf = B;
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn get(&self, i: usize) -> Option<&B> {
        self.as_slice().get(i)
    }
}

/// No buffers: what the end of a whole [`Batch`](super::Batch) holds
/// ([`Launched::group_end`](super::Launched::group_end)), whose ops each
/// keep their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NoBuffers;

impl DeviceBuffers for NoBuffers {
    type Buf = RawDeviceBuffer;
    fn len(&self) -> usize {
        0
    }
    fn get(&self, _: usize) -> Option<&RawDeviceBuffer> {
        None
    }
}

/// An element type chorus can keep in device memory: an [`Element`] that
/// cudarc can copy.
pub trait DeviceElement: Element + DeviceRepr {}
impl<T: Element + DeviceRepr> DeviceElement for T {}

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

impl<T: DeviceElement> DeviceBuffer<T> {
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

// SAFETY: the pointer, length and type are the slice's, fixed at
// construction; the slice owns its allocation (freed when the buffer, and
// so the slice, is dropped), and it is on the producer stream's device
// (checked by `on_stream`; `new` takes the slice's own stream).
unsafe impl<T: DeviceElement> DeviceMem for DeviceBuffer<T> {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn count(&self) -> usize {
        self.slice.len()
    }
    fn dtype(&self) -> DType {
        T::DTYPE
    }
    fn stream(&self) -> &Stream {
        &self.stream
    }
}

/// Device memory owned by someone else (another tensor library), described
/// by a raw pointer: the raw-pointer entry of the NCCL backend. For a type
/// of your own, implementing [`DeviceMem`] keeps the memory's owner with
/// the op instead.
#[derive(Debug)]
pub struct RawDeviceBuffer {
    ptr: u64,
    count: usize,
    dtype: DType,
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
    pub unsafe fn new(ptr: u64, count: usize, dtype: DType, stream: Stream) -> Self {
        RawDeviceBuffer {
            ptr,
            count,
            dtype,
            stream,
        }
    }
}

// SAFETY: `RawDeviceBuffer::new`'s contract is `DeviceMem`'s, passed on to
// whoever built the value.
unsafe impl DeviceMem for RawDeviceBuffer {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn count(&self) -> usize {
        self.count
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn stream(&self) -> &Stream {
        &self.stream
    }
}

/// Makes `stream` (if any) and each buffer's producer stream wait on `ev`,
/// each stream once.
pub(super) fn order_after<C: DeviceBuffers>(
    ev: &Event,
    stream: Option<&Stream>,
    bufs: &C,
) -> Result<(), CudaError> {
    if let Some(s) = stream {
        s.wait_event(ev)?;
    }
    for (i, b) in bufs.iter().enumerate() {
        let raw = b.stream().as_raw();
        let seen = stream.is_some_and(|s| s.as_raw() == raw)
            || bufs.iter().take(i).any(|p| p.stream().as_raw() == raw);
        if !seen {
            b.stream().wait_event(ev)?;
        }
    }
    Ok(())
}
