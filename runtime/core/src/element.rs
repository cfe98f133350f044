//! Element types and type-erased host buffers.
//!
//! A collective is typed at the API (`Vec<f32>`, `Vec<bf16>`, ...) and
//! type-erased inside the TCP backend as a [`HostBuffer`], which moves the
//! vector without copying and gives it back with its type intact.

use std::fmt;

use half::{bf16, f16};

use crate::op::DType;

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
    U32(Vec<u32>),
    U64(Vec<u64>),
}

/// Runs `$body` with `$v` bound to the vector inside `$buf`, whatever its
/// type.
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
            HostBuffer::U32($v) => $body,
            HostBuffer::U64($v) => $body,
        }
    };
}

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
            HostBuffer::U32(_) => DType::U32,
            HostBuffer::U64(_) => DType::U64,
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
            DType::U32 => HostBuffer::U32(vec![0; len]),
            DType::U64 => HostBuffer::U64(vec![0; len]),
        }
    }

    /// Cuts the buffer into consecutive buffers of `lens` elements, in
    /// order (the inverse of concatenating them). Lengths that add up to
    /// less than the buffer leave the rest in a last, extra buffer; lengths
    /// beyond it give shorter (or empty) trailing buffers.
    pub fn split(self, lens: &[usize]) -> Vec<HostBuffer> {
        fn cut<T>(
            mut v: Vec<T>,
            lens: &[usize],
            wrap: fn(Vec<T>) -> HostBuffer,
        ) -> Vec<HostBuffer> {
            let mut out = Vec::with_capacity(lens.len() + 1);
            let mut tail = Vec::new();
            let total: usize = lens.iter().sum();
            if v.len() > total {
                tail = v.split_off(total);
            }
            let mut parts = Vec::with_capacity(lens.len());
            for &len in lens.iter().rev() {
                let at = v.len().saturating_sub(len);
                parts.push(v.split_off(at));
            }
            out.extend(parts.into_iter().rev().map(wrap));
            if !tail.is_empty() {
                out.push(wrap(tail));
            }
            out
        }
        match self {
            HostBuffer::F32(v) => cut(v, lens, HostBuffer::F32),
            HostBuffer::F64(v) => cut(v, lens, HostBuffer::F64),
            HostBuffer::F16(v) => cut(v, lens, HostBuffer::F16),
            HostBuffer::BF16(v) => cut(v, lens, HostBuffer::BF16),
            HostBuffer::I8(v) => cut(v, lens, HostBuffer::I8),
            HostBuffer::U8(v) => cut(v, lens, HostBuffer::U8),
            HostBuffer::I32(v) => cut(v, lens, HostBuffer::I32),
            HostBuffer::I64(v) => cut(v, lens, HostBuffer::I64),
            HostBuffer::U32(v) => cut(v, lens, HostBuffer::U32),
            HostBuffer::U64(v) => cut(v, lens, HostBuffer::U64),
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// An element type chorus can move through collectives.
///
/// Implemented for `f32`, `f64`, `f16`, `bf16` (from `half`), `i8`, `u8`,
/// `i32`, `i64`, `u32` and `u64`; sealed.
pub trait Element:
    bytemuck::Pod + PartialOrd + Send + Sync + fmt::Debug + sealed::Sealed + 'static
{
    /// The dtype tag.
    const DTYPE: DType;
    /// Wraps a vector without copying.
    fn into_host(v: Vec<Self>) -> HostBuffer;
    /// Unwraps a vector of this type; gives the buffer back otherwise.
    ///
    /// # Errors
    ///
    /// The buffer itself when it holds another type.
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
element!(u32, U32);
element!(u64, U64);

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn split_undoes_a_concatenation() {
        let b = HostBuffer::I32((0..10).collect());
        let parts = b.split(&[3, 0, 7]);
        assert_eq!(
            parts,
            vec![
                HostBuffer::I32(vec![0, 1, 2]),
                HostBuffer::I32(vec![]),
                HostBuffer::I32((3..10).collect()),
            ]
        );
        let parts = HostBuffer::U8(vec![1, 2, 3]).split(&[1]);
        assert_eq!(
            parts,
            vec![HostBuffer::U8(vec![1]), HostBuffer::U8(vec![2, 3])]
        );
    }

    #[test]
    fn every_dtype_has_an_element_type() {
        fn check<T: Element>() {
            let b = T::into_host(vec![T::zeroed(); 3]);
            assert_eq!(b.dtype(), T::DTYPE);
            assert_eq!(b.as_bytes().len(), 3 * T::DTYPE.size());
            assert_eq!(HostBuffer::zeros(T::DTYPE, 3), b);
            assert!(T::from_host(b).is_ok());
        }
        check::<f32>();
        check::<f64>();
        check::<f16>();
        check::<bf16>();
        check::<i8>();
        check::<u8>();
        check::<i32>();
        check::<i64>();
        check::<u32>();
        check::<u64>();
    }
}
