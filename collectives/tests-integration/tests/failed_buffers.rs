//! A failed op gives its buffers back (`Failed<B>`): the very buffers
//! passed in (same allocation, length and capacity), whatever stopped it:
//! a mismatch, its timeout, a lost peer, an abort from outside, a blocking
//! wait that gave up.

use std::time::Duration;

use chorus::{ReduceOp, WorkError};
use tests_integration::testkit::local_groups;

const T: Duration = Duration::from_secs(10);

/// A vector with spare capacity, and what identifies its allocation.
fn buffer(len: usize, fill: f32) -> (Vec<f32>, (*const f32, usize, usize)) {
    let mut v = Vec::with_capacity(len + 17);
    v.resize(len, fill);
    let id = (v.as_ptr(), v.len(), v.capacity());
    (v, id)
}

fn id(v: &Vec<f32>) -> (*const f32, usize, usize) {
    (v.as_ptr(), v.len(), v.capacity())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mismatched_op_gives_back_the_very_buffers_passed_in() {
    let groups = local_groups(2, T).await;
    let (a, a_id) = buffer(12, 1.0);
    let (inp, in_id) = buffer(10, 2.0);
    let (out, out_id) = buffer(20, 3.0);
    let w0 = groups[0].all_reduce(a, ReduceOp::Sum).unwrap();
    let w1 = groups[1].all_gather(inp, out).unwrap();
    let (r0, r1) = tokio::join!(w0, w1);
    let f0 = r0.unwrap_err();
    assert!(matches!(f0.error(), WorkError::Mismatch { .. }), "{f0}");
    assert_eq!(id(f0.buffers.as_ref().expect("rank 0's buffer")), a_id);
    let f1 = r1.unwrap_err();
    assert!(matches!(f1.error(), WorkError::Mismatch { .. }), "{f1}");
    let (i, o) = f1.into_buffers().expect("rank 1's buffers");
    assert_eq!((id(&i), id(&o)), (in_id, out_id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_op_gives_its_buffer_back() {
    let groups = local_groups(2, T).await;
    let (a, a_id) = buffer(5, 1.0);
    // Rank 1 never calls.
    let f = groups[0]
        .with_timeout(Duration::from_millis(200))
        .all_reduce(a, ReduceOp::Sum)
        .unwrap()
        .await
        .unwrap_err();
    assert!(matches!(f.error(), WorkError::OpTimeout { .. }), "{f}");
    assert_eq!(id(&f.into_buffers().expect("buffer back")), a_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_op_whose_peer_is_lost_gives_its_buffer_back() {
    let groups = local_groups(3, T).await;
    // Large enough for the ring path: the survivors are mid-op when the
    // third rank goes.
    let len = 300_000;
    let mut works = Vec::new();
    let mut ids = Vec::new();
    for g in &groups[..2] {
        let (v, vid) = buffer(len, 1.0);
        ids.push(vid);
        works.push(g.all_reduce(v, ReduceOp::Sum).unwrap());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    groups[2].abort("rank 2 goes away");
    drop(groups);
    for (w, want) in works.into_iter().zip(ids) {
        let f = tokio::time::timeout(T, w)
            .await
            .expect("bounded")
            .unwrap_err();
        assert!(
            matches!(
                f.error(),
                WorkError::PeerLost { .. }
                    | WorkError::Aborted { .. }
                    | WorkError::Remote { origin: 2, .. }
            ),
            "{f}"
        );
        assert_eq!(id(&f.into_buffers().expect("buffer back")), want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_aborted_from_outside_give_their_buffers_back() {
    let groups = local_groups(2, T).await;
    let pg = &groups[0];
    // The first runs (waiting for rank 1), the second waits in the queue.
    let (a, a_id) = buffer(8, 1.0);
    let (b, b_id) = buffer(9, 2.0);
    let wa = pg.all_reduce(a, ReduceOp::Sum).unwrap();
    let wb = pg.all_reduce(b, ReduceOp::Max).unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    pg.abort("stop everything");
    for (w, want) in [(wa, a_id), (wb, b_id)] {
        let f = tokio::time::timeout(T, w)
            .await
            .expect("bounded")
            .unwrap_err();
        assert!(matches!(f.error(), WorkError::Aborted { .. }), "{f}");
        assert!(f.to_string().contains("stop everything"), "{f}");
        assert_eq!(id(&f.into_buffers().expect("buffer back")), want);
    }
    // A refused call after the abort gives them back too (`Rejected`).
    let (c, c_id) = buffer(3, 0.0);
    let r = pg.all_reduce(c, ReduceOp::Sum).unwrap_err();
    assert_eq!(id(&r.into_buffers()), c_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_wait_that_gives_up_gets_the_buffer_back() {
    let groups = local_groups(2, T).await;
    let (a, a_id) = buffer(6, 1.0);
    let w = groups[0].all_reduce(a, ReduceOp::Sum).unwrap();
    let f = tokio::task::spawn_blocking(move || w.wait_timeout(Duration::from_millis(100)))
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(f.error(), WorkError::OpTimeout { .. }), "{f}");
    assert_eq!(id(&f.into_buffers().expect("buffer back")), a_id);
    assert!(groups[0].error().is_some(), "the wait aborted the group");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn question_mark_turns_a_failure_into_an_error() {
    async fn run(pg: &chorus::ProcessGroup) -> Result<Vec<f32>, chorus::Error> {
        Ok(pg.all_reduce(vec![1.0f32; 4], ReduceOp::Sum)?.await?)
    }
    let groups = local_groups(2, T).await;
    let pg = groups[0].with_timeout(Duration::from_millis(100));
    match run(&pg).await {
        Err(chorus::Error::Work(WorkError::OpTimeout { .. })) => {}
        other => panic!("expected an op timeout, got {other:?}"),
    }
}
