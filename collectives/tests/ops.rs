//! Every op × dtype × size (0, 1, a prime, uneven large) × world size 1..5,
//! ranks as tasks of one process over loopback, checked against a serial
//! reference on fresh random data. Outputs are poisoned before each op.

mod common;

use std::time::Duration;

use chorus::{ProcessGroup, ReduceOp};
use common::{data, local_groups, on_all, poison, reference, TestElem};
use half::{bf16, f16};

const SIZES: [usize; 5] = [0, 1, 13, 4099, 70_001];
const OPS: [ReduceOp; 5] = [
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Min,
    ReduceOp::Max,
    ReduceOp::Avg,
];

/// Runs every op on one rank for element type `T`; returns how many checks
/// passed (the caller checks every rank ran them all).
async fn run_all<T: TestElem>(pg: ProcessGroup, salt: u64) -> usize {
    let (rank, size) = (pg.rank(), pg.size());
    let mut checks = 0;
    for (si, &len) in SIZES.iter().enumerate() {
        let case = |k: u64| salt * 1_000 + si as u64 * 100 + k;
        for (oi, &op) in OPS.iter().enumerate() {
            let c = case(oi as u64);
            let out = pg
                .all_reduce(data::<T>(c, rank, len, op), op)
                .unwrap()
                .await
                .unwrap();
            assert_eq!(out, reference::<T>(c, size, len, op), "all_reduce {op} len {len} size {size}");
            checks += 1;
        }

        let c = case(10);
        let root = (c as usize) % size;
        let buf = if rank == root { data::<T>(c, rank, len, ReduceOp::Sum) } else { poison(len) };
        let out = pg.broadcast(buf, root).unwrap().await.unwrap();
        assert_eq!(out, data::<T>(c, root, len, ReduceOp::Sum), "broadcast len {len}");
        checks += 1;

        for (oi, &op) in OPS.iter().enumerate() {
            let c = case(20 + oi as u64);
            let root = (c as usize + 1) % size;
            let mine = data::<T>(c, rank, len, op);
            let out = pg.reduce(mine.clone(), root, op).unwrap().await.unwrap();
            if rank == root {
                assert_eq!(out, reference::<T>(c, size, len, op), "reduce {op} len {len}");
            } else {
                assert_eq!(out, mine, "reduce leaves non-root buffers unchanged");
            }
            checks += 1;
        }

        let c = case(30);
        let (inp, out) = pg
            .all_gather(data::<T>(c, rank, len, ReduceOp::Sum), poison(size * len))
            .unwrap()
            .await
            .unwrap();
        assert_eq!(inp, data::<T>(c, rank, len, ReduceOp::Sum));
        let expect: Vec<T> = (0..size).flat_map(|r| data::<T>(c, r, len, ReduceOp::Sum)).collect();
        assert_eq!(out, expect, "all_gather len {len}");
        checks += 1;

        for (oi, &op) in OPS.iter().enumerate() {
            let c = case(40 + oi as u64);
            let (_, out) = pg
                .reduce_scatter(data::<T>(c, rank, size * len, op), poison(len), op)
                .unwrap()
                .await
                .unwrap();
            let full = reference::<T>(c, size, size * len, op);
            assert_eq!(out, full[rank * len..(rank + 1) * len].to_vec(), "reduce_scatter {op} len {len}");
            checks += 1;
        }

        let c = case(50);
        let (_, out) = pg
            .all_to_all(data::<T>(c, rank, size * len, ReduceOp::Sum), poison(size * len))
            .unwrap()
            .await
            .unwrap();
        let expect: Vec<T> = (0..size)
            .flat_map(|i| data::<T>(c, i, size * len, ReduceOp::Sum)[rank * len..(rank + 1) * len].to_vec())
            .collect();
        assert_eq!(out, expect, "all_to_all len {len}");
        checks += 1;

        if size > 1 {
            let c = case(60);
            let next = (rank + 1) % size;
            let prev = (rank + size - 1) % size;
            // Both submitted before either is awaited: eager submission.
            let s = pg.send(data::<T>(c, rank, len, ReduceOp::Sum), next).unwrap();
            let r = pg.recv(poison::<T>(len), prev).unwrap();
            let got = r.await.unwrap();
            s.await.unwrap();
            assert_eq!(got, data::<T>(c, prev, len, ReduceOp::Sum), "send/recv len {len}");
            checks += 1;
        }
    }
    pg.barrier().unwrap().await.unwrap();
    checks + 1
}

async fn matrix(size: usize) {
    let groups = local_groups(size, Duration::from_secs(30)).await;
    macro_rules! each {
        ($($t:ty => $salt:expr),*) => {$(
            let counts = on_all(&groups, |pg| run_all::<$t>(pg, $salt)).await;
            assert!(counts.iter().all(|&c| c == counts[0] && c > 0), "{counts:?}");
        )*};
    }
    each!(f32 => 1, f64 => 2, f16 => 3, bf16 => 4, i8 => 5, u8 => 6, i32 => 7, i64 => 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_op_world_1() {
    matrix(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_op_world_2() {
    matrix(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_op_world_3() {
    matrix(3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_op_world_4() {
    matrix(4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_op_world_5() {
    matrix(5).await;
}
