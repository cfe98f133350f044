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

impl HostBuffer {
    /// The buffers one after another, as one buffer: `None` if they are not
    /// all of one type (or there is none).
    pub fn concat(parts: Vec<HostBuffer>) -> Option<HostBuffer> {
        fn join<T: Copy>(
            parts: Vec<HostBuffer>,
            take: fn(HostBuffer) -> Option<Vec<T>>,
        ) -> Option<Vec<T>> {
            let mut it = parts.into_iter();
            let mut out = take(it.next()?)?;
            for p in it {
                out.extend_from_slice(&take(p)?);
            }
            Some(out)
        }
        let dtype = parts.first()?.dtype();
        macro_rules! cat {
            ($($v:ident),*) => {
                match dtype {
                    $(DType::$v => join(parts, |b| match b {
                        HostBuffer::$v(v) => Some(v),
                        _ => None,
                    }).map(HostBuffer::$v),)*
                }
            };
        }
        cat!(F32, F64, F16, BF16, I8, U8, I32, I64, U32, U64)
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

/// The host buffers of one op, as it takes them and gives them back: one
/// buffer (`Vec<T>`), an input and an output (`(Vec<T>, Vec<T>)`), several
/// (`Vec<Vec<T>>`, a coalesced op), or none (`()`, a barrier). Sealed.
pub trait HostBuffers: Sized + Send + sealed::Sealed + 'static {
    /// Number of buffers.
    fn len(&self) -> usize;
    /// True if there is no buffer.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Element count of buffer `i`.
    fn count(&self, i: usize) -> Option<usize>;
    /// The element type (`None` without buffers).
    fn dtype(&self) -> Option<DType>;
    /// The buffers, type-erased, in order.
    fn into_host(self) -> Vec<HostBuffer>;
    /// The buffers back with their types; `None` if `v` does not hold this
    /// shape.
    fn from_host(v: Vec<HostBuffer>) -> Option<Self>;
    /// The shape with no elements (what a buffer that does not fit the
    /// shape comes back as in [`recover`](Self::recover)).
    fn empty() -> Self;
    /// The buffers back with their types, for buffers this shape made with
    /// [`into_host`](Self::into_host): they always fit; anything that does
    /// not is replaced by empty buffers rather than lost silently in a
    /// panic.
    fn recover(v: Vec<HostBuffer>) -> Self {
        Self::from_host(v).unwrap_or_else(Self::empty)
    }
}

impl<T: Element> sealed::Sealed for Vec<T> {}
impl<T: Element> HostBuffers for Vec<T> {
    fn len(&self) -> usize {
        1
    }
    fn count(&self, i: usize) -> Option<usize> {
        (i == 0).then_some(Vec::len(self))
    }
    fn dtype(&self) -> Option<DType> {
        Some(T::DTYPE)
    }
    fn into_host(self) -> Vec<HostBuffer> {
        vec![T::into_host(self)]
    }
    fn from_host(v: Vec<HostBuffer>) -> Option<Self> {
        let mut it = v.into_iter();
        let b = T::from_host(it.next()?).ok()?;
        it.next().is_none().then_some(b)
    }
    fn empty() -> Self {
        Vec::new()
    }
}

impl<T: Element> sealed::Sealed for (Vec<T>, Vec<T>) {}
impl<T: Element> HostBuffers for (Vec<T>, Vec<T>) {
    fn len(&self) -> usize {
        2
    }
    fn count(&self, i: usize) -> Option<usize> {
        match i {
            0 => Some(self.0.len()),
            1 => Some(self.1.len()),
            _ => None,
        }
    }
    fn dtype(&self) -> Option<DType> {
        Some(T::DTYPE)
    }
    fn into_host(self) -> Vec<HostBuffer> {
        vec![T::into_host(self.0), T::into_host(self.1)]
    }
    fn from_host(v: Vec<HostBuffer>) -> Option<Self> {
        let mut it = v.into_iter();
        let a = T::from_host(it.next()?).ok()?;
        let b = T::from_host(it.next()?).ok()?;
        it.next().is_none().then_some((a, b))
    }
    fn empty() -> Self {
        (Vec::new(), Vec::new())
    }
}

impl<T: Element> sealed::Sealed for Vec<Vec<T>> {}
impl<T: Element> HostBuffers for Vec<Vec<T>> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn count(&self, i: usize) -> Option<usize> {
        self.get(i).map(Vec::len)
    }
    fn dtype(&self) -> Option<DType> {
        Some(T::DTYPE)
    }
    fn into_host(self) -> Vec<HostBuffer> {
        self.into_iter().map(T::into_host).collect()
    }
    fn from_host(v: Vec<HostBuffer>) -> Option<Self> {
        v.into_iter().map(|b| T::from_host(b).ok()).collect()
    }
    fn empty() -> Self {
        Vec::new()
    }
}

impl sealed::Sealed for () {}
impl HostBuffers for () {
    fn len(&self) -> usize {
        0
    }
    fn count(&self, _: usize) -> Option<usize> {
        None
    }
    fn dtype(&self) -> Option<DType> {
        None
    }
    fn into_host(self) -> Vec<HostBuffer> {
        Vec::new()
    }
    fn from_host(v: Vec<HostBuffer>) -> Option<Self> {
        v.is_empty().then_some(())
    }
    fn empty() -> Self {}
}

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
    fn concat_joins_one_type_only() {
        let parts = vec![HostBuffer::F32(vec![1.0]), HostBuffer::F32(vec![2.0, 3.0])];
        assert_eq!(
            HostBuffer::concat(parts),
            Some(HostBuffer::F32(vec![1.0, 2.0, 3.0]))
        );
        let mixed = vec![HostBuffer::F32(vec![1.0]), HostBuffer::I8(vec![2])];
        assert_eq!(HostBuffer::concat(mixed), None);
        assert_eq!(HostBuffer::concat(Vec::new()), None);
    }

    #[test]
    fn shapes_go_to_host_buffers_and_back() {
        let pair = (vec![1u32, 2], vec![3u32]);
        assert_eq!(
            (pair.len(), pair.count(1), pair.dtype()),
            (2, Some(1), Some(DType::U32))
        );
        let back: Option<(Vec<u32>, Vec<u32>)> = HostBuffers::from_host(pair.clone().into_host());
        assert_eq!(back, Some(pair));
        let many = vec![vec![1i64], vec![], vec![2, 3]];
        let back: Option<Vec<Vec<i64>>> = HostBuffers::from_host(many.clone().into_host());
        assert_eq!(back, Some(many));
        // The wrong type or number is refused, not guessed.
        assert_eq!(
            <Vec<f32> as HostBuffers>::from_host(vec![HostBuffer::I8(vec![1])]),
            None
        );
        assert_eq!(<Vec<f32> as HostBuffers>::from_host(Vec::new()), None);
        assert_eq!(
            <() as HostBuffers>::from_host(vec![HostBuffer::U8(vec![])]),
            None
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
