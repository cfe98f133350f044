//! Shared helpers of the chorus integration tests: ranks as tasks of one
//! process, random test data, serial references.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use chorus::reduce::{reference_reduce, Reducible};
use chorus::{Element, ProcessGroup, ReduceOp, TcpOptions};
use chorus_runtime::store::{InMemoryStore, Store};
use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Element types the tests can fill with small random integers, so that
/// sums, products and means are exact in every order and results can be
/// compared bit for bit with the serial reference.
pub trait TestElem: Element + Reducible {
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

pub fn reference<T: TestElem>(case: u64, size: usize, len: usize, op: ReduceOp) -> Vec<T> {
    let inputs: Vec<Vec<T>> = (0..size).map(|r| data(case, r, len, op)).collect();
    reference_reduce(op, &inputs)
}

/// Builds `size` ranks of one group as tasks of this process, over loopback,
/// sharing one in-memory store.
pub async fn local_groups(size: usize, timeout: Duration) -> Vec<ProcessGroup> {
    local_groups_with(size, timeout, TcpOptions::default()).await
}

pub async fn local_groups_with(size: usize, timeout: Duration, tcp: TcpOptions) -> Vec<ProcessGroup> {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let handles: Vec<_> = (0..size)
        .map(|rank| {
            let store = store.clone();
            let tcp = tcp.clone();
            tokio::spawn(async move {
                ProcessGroup::builder()
                    .rank(rank)
                    .world_size(size)
                    .store(store)
                    .timeout(timeout)
                    .tcp_options(tcp)
                    .build()
                    .await
            })
        })
        .collect();
    let mut groups = Vec::new();
    for h in handles {
        groups.push(h.await.expect("rank task").expect("group setup"));
    }
    groups
}

/// Runs `f(group)` on every rank concurrently and returns the results by
/// rank.
pub async fn on_all<F, Fut, R>(groups: &[ProcessGroup], f: F) -> Vec<R>
where
    F: Fn(ProcessGroup) -> Fut,
    Fut: std::future::Future<Output = R> + Send + 'static,
    R: Send + 'static,
{
    let handles: Vec<_> = groups.iter().map(|g| tokio::spawn(f(g.clone()))).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("rank task panicked"));
    }
    out
}
