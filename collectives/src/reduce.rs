//! Element-wise reduction kernels on host memory.
//!
//! Integer sums and products wrap on overflow, as NCCL's do; `f16` and
//! `bf16` are combined in `f32` and rounded back after each step.

use half::{bf16, f16};

use chorus_core::{Element, HostBuffer, ReduceOp};

/// Arithmetic a reduction needs, per element type (sealed through
/// [`Element`]).
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub trait Reducible: Element + Copy {
    /// Combines two elements with `op` (`Avg` sums).
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self;
    /// Divides by the group size, for [`ReduceOp::Avg`].
    fn div_count(a: Self, n: usize) -> Self;
}

macro_rules! float_reducible {
    ($t:ty) => {
        impl Reducible for $t {
            #[inline]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a + b,
                    ReduceOp::Prod => a * b,
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                }
            }
            #[inline]
            fn div_count(a: Self, n: usize) -> Self {
                a / n as $t
            }
        }
    };
}
float_reducible!(f32);
float_reducible!(f64);

macro_rules! half_reducible {
    ($t:ty) => {
        impl Reducible for $t {
            #[inline]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                <$t>::from_f32(f32::combine(op, a.to_f32(), b.to_f32()))
            }
            #[inline]
            fn div_count(a: Self, n: usize) -> Self {
                <$t>::from_f32(a.to_f32() / n as f32)
            }
        }
    };
}
half_reducible!(f16);
half_reducible!(bf16);

macro_rules! int_reducible {
    ($t:ty) => {
        impl Reducible for $t {
            #[inline]
            fn combine(op: ReduceOp, a: Self, b: Self) -> Self {
                match op {
                    ReduceOp::Sum | ReduceOp::Avg => a.wrapping_add(b),
                    ReduceOp::Prod => a.wrapping_mul(b),
                    ReduceOp::Min => a.min(b),
                    ReduceOp::Max => a.max(b),
                }
            }
            #[inline]
            fn div_count(a: Self, n: usize) -> Self {
                // Group sizes fit every integer type's range except i8/u8
                // beyond 127/255 ranks, where the mean is 0 anyway.
                match <$t>::try_from(n) {
                    Ok(d) if d != 0 => a / d,
                    _ => 0,
                }
            }
        }
    };
}
int_reducible!(i8);
int_reducible!(u8);
int_reducible!(i32);
int_reducible!(i64);
int_reducible!(u32);
int_reducible!(u64);

fn combine_slice<T: Reducible>(op: ReduceOp, dst: &mut [T], src: &[u8]) {
    match bytemuck::try_cast_slice::<u8, T>(src) {
        Ok(s) => {
            for (d, s) in dst.iter_mut().zip(s) {
                *d = T::combine(op, *d, *s);
            }
        }
        Err(_) => {
            // Unaligned receive buffer: read element by element.
            let size = std::mem::size_of::<T>();
            for (d, chunk) in dst.iter_mut().zip(src.chunks_exact(size)) {
                let s: T = bytemuck::pod_read_unaligned(chunk);
                *d = T::combine(op, *d, s);
            }
        }
    }
}

/// Combines `src` (raw bytes of the same dtype) into elements
/// `range` of `dst`: `dst[i] = op(dst[i], src[i])`. For [`ReduceOp::Avg`]
/// this sums; call [`finish_avg`] once at the end.
///
/// `src.len()` must be `range.len() * dtype.size()`; shorter input combines
/// only the elements it covers.
pub(crate) fn combine_into(
    op: ReduceOp,
    dst: &mut HostBuffer,
    range: std::ops::Range<usize>,
    src: &[u8],
) {
    match dst {
        HostBuffer::F32(v) => combine_slice(op, &mut v[range], src),
        HostBuffer::F64(v) => combine_slice(op, &mut v[range], src),
        HostBuffer::F16(v) => combine_slice(op, &mut v[range], src),
        HostBuffer::BF16(v) => combine_slice(op, &mut v[range], src),
        HostBuffer::I8(v) => combine_slice(op, &mut v[range], src),
        HostBuffer::U8(v) => combine_slice(op, &mut v[range], src),
        HostBuffer::I32(v) => combine_slice(op, &mut v[range], src),
        HostBuffer::I64(v) => combine_slice(op, &mut v[range], src),
        HostBuffer::U32(v) => combine_slice(op, &mut v[range], src),
        HostBuffer::U64(v) => combine_slice(op, &mut v[range], src),
    }
}

fn div_slice<T: Reducible>(v: &mut [T], n: usize) {
    for x in v {
        *x = T::div_count(*x, n);
    }
}

/// Turns a sum into a mean over `n` ranks, on elements `range`, for
/// [`ReduceOp::Avg`]; does nothing for other ops.
pub(crate) fn finish_avg(
    op: ReduceOp,
    buf: &mut HostBuffer,
    range: std::ops::Range<usize>,
    n: usize,
) {
    if op != ReduceOp::Avg {
        return;
    }
    match buf {
        HostBuffer::F32(v) => div_slice(&mut v[range], n),
        HostBuffer::F64(v) => div_slice(&mut v[range], n),
        HostBuffer::F16(v) => div_slice(&mut v[range], n),
        HostBuffer::BF16(v) => div_slice(&mut v[range], n),
        HostBuffer::I8(v) => div_slice(&mut v[range], n),
        HostBuffer::U8(v) => div_slice(&mut v[range], n),
        HostBuffer::I32(v) => div_slice(&mut v[range], n),
        HostBuffer::I64(v) => div_slice(&mut v[range], n),
        HostBuffer::U32(v) => div_slice(&mut v[range], n),
        HostBuffer::U64(v) => div_slice(&mut v[range], n),
    }
}

/// Serial reference: reduces `inputs` (one per rank, in rank order) with
/// `op`, combining left to right. Used by tests and examples to check
/// results (`chorus::test_util`, feature `test-util`).
#[cfg(any(test, feature = "test-util"))]
pub fn reference_reduce<T: Reducible>(op: ReduceOp, inputs: &[Vec<T>]) -> Vec<T> {
    let Some(first) = inputs.first() else {
        return Vec::new();
    };
    let mut acc = first.clone();
    for other in &inputs[1..] {
        for (a, b) in acc.iter_mut().zip(other) {
            *a = T::combine(op, *a, *b);
        }
    }
    if op == ReduceOp::Avg {
        div_slice(&mut acc, inputs.len());
    }
    acc
}
