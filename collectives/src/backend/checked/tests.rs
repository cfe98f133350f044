//! The checked mode across ranks of one process, and the signatures.

use std::sync::Arc;
use std::time::Duration;

use chorus_core::{DType, Op, ReduceOp, WorkError};
use chorus_store::{InMemoryStore, Store};

use super::signature::{describe, digest, signature, Signature};
use crate::ProcessGroup;

/// Every rank of a checked group of `n` verifies `sigs(rank)` at once;
/// their outcomes by rank.
fn verify_all(n: usize, sigs: impl Fn(usize) -> Vec<Signature>) -> Vec<Result<(), WorkError>> {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let groups: Vec<ProcessGroup> =
        futures::executor::block_on(futures::future::join_all((0..n).map(|rank| {
            ProcessGroup::builder()
                .rank(rank)
                .world_size(n)
                .store(store.clone())
                .peer_liveness(Duration::ZERO)
                .check_ops(true)
                .build()
        })))
        .into_iter()
        .map(|g| g.expect("group setup"))
        .collect();
    let threads: Vec<_> = groups
        .into_iter()
        .enumerate()
        .map(|(r, g)| {
            let mine = sigs(r);
            std::thread::spawn(move || {
                let seq = &g.inner.seq;
                let mut counters = seq.lock();
                let ctx = seq.ctx(counters.next(Op::Barrier), "all_reduce");
                let checker = g.inner.nccl.checker.as_ref().expect("checked mode");
                checker.verify(seq, &mut counters, &ctx, &mine)
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|t| t.join().expect("rank thread"))
        .collect()
}

fn detail(r: &Result<(), WorkError>) -> String {
    match r {
        Err(WorkError::Mismatch { detail, .. }) => detail.clone(),
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

#[test]
fn agreeing_launches_pass_and_differing_ones_fail_on_every_rank() {
    let ar = |count| signature(Op::AllReduce(ReduceOp::Sum), Some(DType::F32), count);
    for r in verify_all(3, |_| vec![ar(8), ar(4)]) {
        assert!(r.is_ok(), "{r:?}");
    }
    // One rank's second op is longer: every rank names both sides.
    let got = verify_all(3, |rank| vec![ar(8), ar(if rank == 2 { 5 } else { 4 })]);
    assert!(
        detail(&got[0]).contains("rank 2 at seq 2 called all_reduce(count=5"),
        "{got:?}"
    );
    assert!(
        detail(&got[2]).contains("rank 0 at seq 2 called all_reduce(count=4"),
        "{got:?}"
    );
    assert!(
        detail(&got[2]).contains("but rank 2 called all_reduce(count=5"),
        "{got:?}"
    );
    // One rank launches another number of ops.
    let got = verify_all(3, |rank| vec![ar(8); if rank == 1 { 2 } else { 1 }]);
    for r in &got {
        assert!(detail(r).contains("device op(s)"), "{got:?}");
    }
    // Roots differ.
    let bc = |root| signature(Op::Broadcast { root }, Some(DType::F32), 8);
    let got = verify_all(2, |rank| vec![bc(rank)]);
    assert!(
        detail(&got[1]).contains("root=0") && detail(&got[1]).contains("root=1"),
        "{got:?}"
    );
}

#[test]
fn signatures_tell_every_field_apart() {
    let base = signature(Op::AllReduce(ReduceOp::Sum), Some(DType::F32), 8);
    let others = [
        signature(Op::AllReduce(ReduceOp::Max), Some(DType::F32), 8),
        signature(Op::AllReduce(ReduceOp::Sum), Some(DType::F64), 8),
        signature(Op::AllReduce(ReduceOp::Sum), Some(DType::F32), 9),
        signature(Op::Broadcast { root: 0 }, Some(DType::F32), 8),
        signature(
            Op::Reduce {
                root: 0,
                op: ReduceOp::Sum,
            },
            Some(DType::F32),
            8,
        ),
    ];
    for o in others {
        assert_ne!(base, o);
        assert_ne!(digest(&[base]), digest(&[o]));
    }
    assert_ne!(
        signature(Op::Broadcast { root: 0 }, Some(DType::F32), 8),
        signature(Op::Broadcast { root: 1 }, Some(DType::F32), 8)
    );
    assert_eq!(describe(&base), "all_reduce(count=8, dtype=f32, op=sum)");
    assert_eq!(
        describe(&signature(Op::Broadcast { root: 2 }, Some(DType::I32), 3)),
        "broadcast(count=3, dtype=i32, root=2)"
    );
}
