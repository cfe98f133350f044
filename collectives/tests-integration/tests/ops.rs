//! Every op × dtype × size (0, 1, a prime, uneven large) × world size 1..5,
//! ranks as tasks of one process over loopback, checked against a serial
//! reference on fresh random data. Outputs are poisoned before each op.
//! (`multiprocess.rs` runs the same checks with one process per rank.)
#![forbid(unsafe_code)]

use std::time::Duration;

use tests_integration::testkit::{check_all_dtypes, local_groups, on_all, SIZES};

async fn matrix(size: usize) {
    let groups = local_groups(size, Duration::from_secs(60)).await;
    let counts = on_all(
        &groups,
        |pg| async move { check_all_dtypes(&pg, &SIZES).await },
    )
    .await;
    let counts: Vec<usize> = counts
        .into_iter()
        .enumerate()
        .map(|(rank, c)| c.unwrap_or_else(|e| panic!("rank {rank}: {e}")))
        .collect();
    assert!(
        counts.iter().all(|&c| c == counts[0] && c > 0),
        "{counts:?}"
    );
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
