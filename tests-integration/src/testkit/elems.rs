//! Test data: element types filled with small random integers, the data
//! of any rank for any case, poison, and the serial reference.

use chorus::reduce::{reference_reduce, Reducible};
use chorus::{Element, ReduceOp};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Element types the tests can fill with small random integers, so that
/// sums, products and means are exact in every order and results can be
/// compared bit for bit with the serial reference.
pub trait TestElem: Element + Reducible {
    /// The value `v` in this type (`u8` takes its absolute value).
    fn from_small(v: i8) -> Self;
}
macro_rules! test_elem {
    ($t:ty, $conv:expr) => {
        impl TestElem for $t {
            fn from_small(v: i8) -> Self {
                let f: fn(i8) -> $t = $conv;
                f(v)
            }
        }
    };
}
test_elem!(f32, |v| v as f32);
test_elem!(f64, |v| v as f64);
test_elem!(f16, |v| f16::from_f32(v as f32));
test_elem!(bf16, |v| bf16::from_f32(v as f32));
test_elem!(i8, |v| v);
test_elem!(u8, |v| v.unsigned_abs());
test_elem!(i32, |v| v as i32);
test_elem!(i64, |v| v as i64);

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
