//! Element types and type-erased host buffers.
//!
//! A collective is typed at the API (`Vec<f32>`, `Vec<bf16>`, ...) and
//! type-erased inside the backends as a [`HostBuffer`], which moves the
//! vector without copying and gives it back with its type intact.

use std::fmt;

use half::{bf16, f16};

/// The element types chorus supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DType {
    /// 32-bit float.
    F32 = 0,
    /// 64-bit float.
    F64 = 1,
    /// IEEE half precision.
    F16 = 2,
    /// bfloat16.
    BF16 = 3,
    /// Signed 8-bit integer.
    I8 = 4,
    /// Unsigned 8-bit integer.
    U8 = 5,
    /// Signed 32-bit integer.
    I32 = 6,
    /// Signed 64-bit integer.
    I64 = 7,
}

impl DType {
    /// All supported types.
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    /// Lower-case name, as in `f32`.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }

    /// Decodes the wire byte of a dtype.
    pub fn from_u8(v: u8) -> Option<DType> {
        DType::ALL.get(v as usize).copied()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a reduction combines elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    /// Sum.
    Sum = 0,
    /// Product.
    Prod = 1,
    /// Minimum.
    Min = 2,
    /// Maximum.
    Max = 3,
    /// Mean: the sum divided by the group size (integer types divide with
    /// truncation toward zero, as NCCL's `ncclAvg` does).
    Avg = 4,
}

impl ReduceOp {
    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// Decodes the wire byte of a reduce op.
    pub fn from_u8(v: u8) -> Option<ReduceOp> {
        [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Min,
            ReduceOp::Max,
            ReduceOp::Avg,
        ]
        .get(v as usize)
        .copied()
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A host vector of any supported type, moved without copying.
#[derive(Clone, PartialEq)]
#[allow(missing_docs)]
pub enum HostBuffer {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    I32(Vec<i32>),
    I64(Vec<i64>),
}

macro_rules! each_buffer {
    ($buf:expr, $v:ident => $body:expr) => {
        match $buf {
            HostBuffer::F32($v) => $body,
            HostBuffer::F64($v) => $body,
            HostBuffer::F16($v) => $body,
            HostBuffer::BF16($v) => $body,
            HostBuffer::I8($v) => $body,
            HostBuffer::U8($v) => $body,
            HostBuffer::I32($v) => $body,
            HostBuffer::I64($v) => $body,
        }
    };
}
#[allow(unused_imports)]
pub(crate) use each_buffer;

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostBuffer({}, len {})", self.dtype(), self.len())
    }
}

impl HostBuffer {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            HostBuffer::F32(_) => DType::F32,
            HostBuffer::F64(_) => DType::F64,
            HostBuffer::F16(_) => DType::F16,
            HostBuffer::BF16(_) => DType::BF16,
            HostBuffer::I8(_) => DType::I8,
            HostBuffer::U8(_) => DType::U8,
            HostBuffer::I32(_) => DType::I32,
            HostBuffer::I64(_) => DType::I64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        each_buffer!(self, v => v.len())
    }

    /// True if there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as bytes (native endianness).
    pub fn as_bytes(&self) -> &[u8] {
        each_buffer!(self, v => bytemuck::cast_slice(v.as_slice()))
    }

    /// The elements as mutable bytes (native endianness).
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        each_buffer!(self, v => bytemuck::cast_slice_mut(v.as_mut_slice()))
    }

    /// A zeroed buffer of `len` elements of `dtype`.
    pub fn zeros(dtype: DType, len: usize) -> HostBuffer {
        match dtype {
            DType::F32 => HostBuffer::F32(vec![0.0; len]),
            DType::F64 => HostBuffer::F64(vec![0.0; len]),
            DType::F16 => HostBuffer::F16(vec![f16::ZERO; len]),
            DType::BF16 => HostBuffer::BF16(vec![bf16::ZERO; len]),
            DType::I8 => HostBuffer::I8(vec![0; len]),
            DType::U8 => HostBuffer::U8(vec![0; len]),
            DType::I32 => HostBuffer::I32(vec![0; len]),
            DType::I64 => HostBuffer::I64(vec![0; len]),
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// An element type chorus can move through collectives.
///
/// Implemented for `f32`, `f64`, [`f16`], [`bf16`], `i8`, `u8`, `i32` and
/// `i64`; sealed.
pub trait Element:
    bytemuck::Pod + PartialOrd + Send + Sync + fmt::Debug + sealed::Sealed + 'static
{
    /// The dtype tag.
    const DTYPE: DType;
    /// Wraps a vector without copying.
    fn into_host(v: Vec<Self>) -> HostBuffer;
    /// Unwraps a vector of this type; gives the buffer back otherwise.
    fn from_host(b: HostBuffer) -> Result<Vec<Self>, HostBuffer>;
}

macro_rules! element {
    ($t:ty, $variant:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn into_host(v: Vec<Self>) -> HostBuffer {
                HostBuffer::$variant(v)
            }
            fn from_host(b: HostBuffer) -> Result<Vec<Self>, HostBuffer> {
                match b {
                    HostBuffer::$variant(v) => Ok(v),
                    other => Err(other),
                }
            }
        }
    };
}
element!(f32, F32);
element!(f64, F64);
element!(f16, F16);
element!(bf16, BF16);
element!(i8, I8);
element!(u8, U8);
element!(i32, I32);
element!(i64, I64);
