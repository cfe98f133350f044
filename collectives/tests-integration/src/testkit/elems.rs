//! Test data: element types filled with small random integers, the data
//! of any rank for any case, poison, and the serial reference.

use chorus::test_util::{reference_reduce, Reducible};
use chorus::{Element, ReduceOp};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Element types the tests can fill with small random integers, so that
/// sums, products and means are exact in every order and results can be
/// compared bit for bit with the serial reference.
pub trait TestElem: Element + Reducible {
    /// The gap between 1 and the next value of this type (0 for integers,
    /// whose results are exact).
    const EPSILON: f64;
    /// The value `v` in this type (`u8` takes its absolute value).
    fn from_small(v: i8) -> Self;
    /// This value as an `f64` (exact for every type here).
    fn to_f64(self) -> f64;
}
macro_rules! test_elem {
    ($t:ty, $eps:expr, $conv:expr, $back:expr) => {
        impl TestElem for $t {
            const EPSILON: f64 = $eps;
            fn from_small(v: i8) -> Self {
                let f: fn(i8) -> $t = $conv;
                f(v)
            }
            fn to_f64(self) -> f64 {
                let f: fn($t) -> f64 = $back;
                f(self)
            }
        }
    };
}
test_elem!(f32, f32::EPSILON as f64, |v| v as f32, |x| x as f64);
test_elem!(f64, f64::EPSILON, |v| v as f64, |x| x);
test_elem!(
    f16,
    0.000_976_562_5, // 2^-10, f16::EPSILON
    |v| f16::from_f32(v as f32),
    |x| x.to_f64()
);
test_elem!(
    bf16,
    0.007_812_5, // 2^-7, bf16::EPSILON
    |v| bf16::from_f32(v as f32),
    |x| x.to_f64()
);
test_elem!(i8, 0.0, |v| v, |x| x as f64);
test_elem!(u8, 0.0, |v| v.unsigned_abs(), |x| x as f64);
test_elem!(i32, 0.0, |v| v as i32, |x| x as f64);
test_elem!(i64, 0.0, |v| v as i64, |x| x as f64);

/// How far a reduced element may be from the serial reference: 0 (bit for
/// bit) but for a floating-point mean over a group whose size is not a
/// power of two, which NCCL computes as a sum of inputs each scaled by
/// 1/size (rounded) rather than the sum divided by size: then a few
/// roundings of [`data`]'s largest magnitude (8) per rank.
pub fn reduce_tolerance<T: TestElem>(op: ReduceOp, size: usize) -> f64 {
    if op == ReduceOp::Avg && !size.is_power_of_two() {
        (size as f64 + 2.0) * T::EPSILON * 8.0
    } else {
        0.0
    }
}

/// Deterministic random data of `rank` for test case `case`: every rank can
/// compute every other rank's input, hence the reference.
pub fn data<T: TestElem>(case: u64, rank: usize, len: usize, op: ReduceOp) -> Vec<T> {
    let mut rng = StdRng::seed_from_u64(case.wrapping_mul(1_000_003).wrapping_add(rank as u64));
    (0..len)
        .map(|_| {
            let v: i8 = match op {
                // Small factors keep products exact and in range.
                ReduceOp::Prod => [-2, -1, 1, 2][rng.gen_range(0..4)],
                _ => rng.gen_range(-8..=8),
            };
            T::from_small(v)
        })
        .collect()
}

/// A poison value that no test result equals by chance.
pub fn poison<T: TestElem>(len: usize) -> Vec<T> {
    vec![T::from_small(101); len]
}

/// The serial reference of reducing every rank's [`data`] with `op`.
pub fn reference<T: TestElem>(case: u64, size: usize, len: usize, op: ReduceOp) -> Vec<T> {
    let inputs: Vec<Vec<T>> = (0..size).map(|r| data(case, r, len, op)).collect();
    reference_reduce(op, &inputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epsilons_are_the_types_own() {
        assert_eq!(<f16 as TestElem>::EPSILON, f16::EPSILON.to_f64());
        assert_eq!(<bf16 as TestElem>::EPSILON, bf16::EPSILON.to_f64());
        assert_eq!(<f32 as TestElem>::EPSILON, f32::EPSILON as f64);
    }

    /// A mean computed as NCCL does (each input times 1/size, rounded in
    /// the type, then summed) stays within the tolerance of the serial
    /// reference, which is exact where size is a power of two.
    fn premul_mean_within_tolerance<T: TestElem>(from: fn(f64) -> T) {
        for size in 1..=8 {
            let tol = reduce_tolerance::<T>(ReduceOp::Avg, size);
            assert_eq!(tol == 0.0, size.is_power_of_two() || T::EPSILON == 0.0);
            let len = 4099;
            let want = reference::<T>(7, size, len, ReduceOp::Avg);
            let scale = from(1.0 / size as f64).to_f64();
            let inputs: Vec<Vec<T>> = (0..size).map(|r| data(7, r, len, ReduceOp::Avg)).collect();
            for (i, w) in want.iter().enumerate() {
                let got = inputs
                    .iter()
                    .map(|x| from(x[i].to_f64() * scale))
                    .fold(0.0, |acc, x| from(acc + x.to_f64()).to_f64());
                let off = (got - w.to_f64()).abs();
                assert!(
                    off <= tol.max(0.0),
                    "size {size} element {i}: {got} vs {w:?}"
                );
            }
        }
    }

    #[test]
    fn nccl_style_means_are_within_the_tolerance() {
        premul_mean_within_tolerance::<f32>(|x| x as f32);
        premul_mean_within_tolerance::<f16>(f16::from_f64);
        premul_mean_within_tolerance::<bf16>(bf16::from_f64);
    }
}
