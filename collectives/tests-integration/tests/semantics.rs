//! Completion rules 1, 4, 5, 7 and 8 (docs/ARCHITECTURE.md) on the TCP
//! backend, plus errors:
//! eager ordered submission, owned buffers, drop detaches, executor
//! agnosticism, honest status, timeouts, mismatches, abort, subgroups.
#![forbid(unsafe_code)]

use std::time::Duration;

use chorus::{Failed, ProcessGroup, ReduceOp, WorkError, WorkStatus};
use tests_integration::testkit::{data, local_groups, on_all, reference};

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awaiting_in_different_orders_does_not_deadlock() {
    let groups = local_groups(3, T).await;
    let results = on_all(&groups, |pg| async move {
        let r = pg.rank();
        let a = pg
            .all_reduce(data::<f32>(1, r, 1000, ReduceOp::Sum), ReduceOp::Sum)
            .unwrap();
        let b = pg
            .all_reduce(data::<f32>(2, r, 100_000, ReduceOp::Sum), ReduceOp::Sum)
            .unwrap();
        let c = pg
            .broadcast(data::<i64>(3, r, 10, ReduceOp::Sum), 2)
            .unwrap();
        // Every rank awaits in a different order.
        let (a, b, c) = match r {
            0 => {
                let a = a.await.unwrap();
                let b = b.await.unwrap();
                (a, b, c.await.unwrap())
            }
            1 => {
                let c = c.await.unwrap();
                let b = b.await.unwrap();
                (a.await.unwrap(), b, c)
            }
            _ => {
                let b = b.await.unwrap();
                let c = c.await.unwrap();
                (a.await.unwrap(), b, c)
            }
        };
        assert_eq!(a, reference::<f32>(1, 3, 1000, ReduceOp::Sum));
        assert_eq!(b, reference::<f32>(2, 3, 100_000, ReduceOp::Sum));
        assert_eq!(c, data::<i64>(3, 2, 10, ReduceOp::Sum));
    })
    .await;
    assert_eq!(results.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_and_forgotten_works_do_not_disturb_later_ops() {
    let groups = local_groups(2, T).await;
    on_all(&groups, |pg| async move {
        let r = pg.rank();
        // Dropped before it finishes: the op still runs (other ranks need it).
        drop(
            pg.all_reduce(data::<f32>(10, r, 50_000, ReduceOp::Sum), ReduceOp::Sum)
                .unwrap(),
        );
        // Leaked: its buffers are never freed while in flight.
        std::mem::forget(
            pg.all_gather(data::<i32>(11, r, 7, ReduceOp::Sum), vec![0; 14])
                .unwrap(),
        );
        let out = pg
            .all_reduce(data::<f64>(12, r, 333, ReduceOp::Max), ReduceOp::Max)
            .unwrap()
            .await
            .unwrap();
        assert_eq!(out, reference::<f64>(12, 2, 333, ReduceOp::Max));
        pg.barrier().unwrap().await.unwrap();
        assert_eq!(pg.pending(), 0, "the dropped and leaked ops completed");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submission_is_eager_and_status_is_honest() {
    let groups = local_groups(2, T).await;
    let (g0, g1) = (groups[0].clone(), groups[1].clone());
    // Rank 0 submits and never polls.
    let w0 = g0
        .all_reduce(data::<f32>(20, 0, 64, ReduceOp::Sum), ReduceOp::Sum)
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        w0.status(),
        WorkStatus::Pending,
        "not done while rank 1 has not called"
    );
    assert!(!w0.is_done());
    // Rank 1 joins and awaits: completes although rank 0's future is never
    // polled, because rank 0's op was submitted at the call.
    let out1 = g1
        .all_reduce(data::<f32>(20, 1, 64, ReduceOp::Sum), ReduceOp::Sum)
        .unwrap()
        .await
        .unwrap();
    assert_eq!(out1, reference::<f32>(20, 2, 64, ReduceOp::Sum));
    // Rank 0's work becomes done without being polled.
    let deadline = std::time::Instant::now() + T;
    while !w0.is_done() {
        assert!(std::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(w0.status(), WorkStatus::Finished);
    assert_eq!(w0.await.unwrap(), out1);
}

/// The same futures under tokio multi-thread, tokio current-thread and
/// futures' block_on: chorus's I/O runs on its own threads.
#[test]
fn executor_agnostic() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let groups = rt.block_on(local_groups(2, T));
    let expect = reference::<i32>(30, 2, 1234, ReduceOp::Sum);
    let run = |pg: ProcessGroup| {
        pg.all_reduce(
            data::<i32>(30, pg.rank(), 1234, ReduceOp::Sum),
            ReduceOp::Sum,
        )
        .unwrap()
    };

    // Rank 0 under a current-thread tokio runtime, rank 1 under block_on.
    let (a, b) = (run(groups[0].clone()), run(groups[1].clone()));
    let t = std::thread::spawn(move || futures::executor::block_on(b).unwrap());
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert_eq!(current.block_on(a).unwrap(), expect);
    assert_eq!(t.join().unwrap(), expect);

    // Both under the multi-thread runtime.
    let (a, b) = (run(groups[0].clone()), run(groups[1].clone()));
    let (x, y) = rt.block_on(async { tokio::join!(a, b) });
    assert_eq!(x.unwrap(), expect);
    assert_eq!(y.unwrap(), expect);

    // Blocking waits from plain threads.
    let (a, b) = (run(groups[0].clone()), run(groups[1].clone()));
    let t = std::thread::spawn(move || b.wait_timeout(T).unwrap());
    assert_eq!(a.wait_timeout(T).unwrap(), expect);
    assert_eq!(t.join().unwrap(), expect);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mismatched_collectives_name_both_sides() {
    let groups = local_groups(2, Duration::from_secs(5)).await;
    let (g0, g1) = (groups[0].clone(), groups[1].clone());
    let w0 = g0.all_reduce(vec![1.0f32; 12], ReduceOp::Sum).unwrap();
    let w1 = g1.all_gather(vec![1.0f32; 10], vec![0.0; 20]).unwrap();
    let (e0, e1) = tokio::join!(w0, w1);
    // Each failed work gives its own buffers back, as they were passed in.
    let (f0, f1) = (e0.unwrap_err(), e1.unwrap_err());
    assert_eq!(f0.buffers.as_ref().map(Vec::len), Some(12));
    assert_eq!(
        f1.buffers.as_ref().map(|(i, o)| (i.len(), o.len())),
        Some((10, 20))
    );
    for e in [f0.error, f1.error] {
        let msg = e.to_string();
        assert!(matches!(e, WorkError::Mismatch { .. }), "{msg}");
        assert!(
            msg.contains("all_reduce") && msg.contains("all_gather"),
            "{msg}"
        );
        assert!(
            msg.contains("count=12") && msg.contains("count=10"),
            "{msg}"
        );
    }
    // The group is errored: later calls fail at once.
    let later = g0.barrier();
    let failed = match later {
        Err(r) => r.error,
        Ok(w) => w.await.unwrap_err().error,
    };
    assert!(!matches!(failed, WorkError::OpTimeout { .. }), "{failed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn op_times_out_when_a_peer_never_calls() {
    let groups = local_groups(2, T).await;
    let start = std::time::Instant::now();
    let w = groups[0]
        .with_timeout(Duration::from_millis(300))
        .all_reduce(vec![1u8; 5], ReduceOp::Sum)
        .unwrap();
    let err = w.await.unwrap_err().into_error();
    assert!(matches!(err, WorkError::OpTimeout { .. }), "{err}");
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(err.context().seq, 1);
    assert_eq!(err.context().op, "all_reduce");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_arguments_give_the_buffers_back() {
    let groups = local_groups(2, T).await;
    let pg = &groups[0];
    let r = pg.all_gather(vec![1i32, 2, 3], vec![0; 5]).unwrap_err();
    assert!(
        matches!(r.error, WorkError::InvalidArgument { .. }),
        "{}",
        r.error
    );
    assert_eq!(r.buffers, (vec![1, 2, 3], vec![0; 5]));
    let r = pg.broadcast(vec![7u8; 4], 9).unwrap_err();
    assert_eq!(r.into_buffers(), vec![7u8; 4]);
    let r = pg.send(vec![1.5f64], 0).unwrap_err();
    assert!(r.error.to_string().contains("itself"));
    let r = pg
        .reduce_scatter(vec![1i64; 5], vec![0; 2], ReduceOp::Sum)
        .unwrap_err();
    assert_eq!(r.buffers.0.len(), 5);
    let r = pg.all_to_all(vec![1i64; 3], vec![0; 3]).unwrap_err();
    assert_eq!(r.buffers.1.len(), 3);
    // Nothing was submitted: the group still works.
    on_all(
        &groups,
        |pg| async move { pg.barrier().unwrap().await.unwrap() },
    )
    .await;
}

/// A refused op shows, like every other error, the sequence number it
/// would have taken; it takes none, so the next op takes that number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_shows_the_number_the_next_op_takes() {
    let groups = local_groups(2, T).await;
    on_all(&groups, |pg| async move {
        pg.all_reduce(vec![1.0f32; 8], ReduceOp::Sum)
            .unwrap()
            .await
            .unwrap()
    })
    .await;
    let pg = &groups[0];
    let r = pg.all_gather(vec![1i32, 2, 3], vec![0; 5]).unwrap_err();
    assert_eq!(r.error.context().seq, 2);
    assert!(
        r.error
            .to_string()
            .starts_with("rank 0 in group 'world' at seq 2 (all_gather): invalid argument: "),
        "{}",
        r.error
    );
    // In a group too (its ops take their numbers at launch: the next).
    let mut g = pg.batch();
    let r = g.broadcast(vec![7u8; 4], 9).unwrap_err();
    assert_eq!(r.error.context().seq, 2, "{}", r.error);
    drop(g);
    // A send's number counts the sends to its peer.
    let r = pg.send(vec![1.5f64], 0).unwrap_err();
    assert_eq!(r.error.context().seq, 1, "{}", r.error);
    // The next collective takes number 2 on both ranks.
    on_all(&groups, |pg| async move {
        pg.all_reduce(vec![1.0f32; 8], ReduceOp::Sum)
            .unwrap()
            .await
            .unwrap()
    })
    .await;
    for pg in &groups {
        let last = pg.flight_record().pop().expect("a record");
        assert_eq!((last.seq, last.op.as_ref()), (2, "all_reduce"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_fails_pending_work_and_later_calls() {
    let groups = local_groups(2, T).await;
    let pg = groups[0].clone();
    let w = pg.all_reduce(vec![1.0f32; 8], ReduceOp::Sum).unwrap();
    pg.abort("test abort");
    let err = w.await.unwrap_err().into_error();
    assert!(matches!(err, WorkError::Aborted { .. }), "{err}");
    assert!(err.to_string().contains("test abort"));
    let r = pg.barrier().unwrap_err();
    assert!(
        matches!(r.error, WorkError::GroupErrored { .. }),
        "{}",
        r.error
    );
    // The peer's matching op may still complete (rank 0's data may have been
    // sent before the abort), but its next op fails: the connection is
    // closed. It fails fast, not by timeout.
    let peer = groups[1].with_timeout(Duration::from_secs(5));
    let _ = peer
        .all_reduce(vec![1.0f32; 8], ReduceOp::Sum)
        .unwrap()
        .await;
    let start = std::time::Instant::now();
    let next = match peer.all_reduce(vec![1.0f32; 8], ReduceOp::Sum) {
        Ok(w) => w.await.map(|_| ()).map_err(Failed::into_error),
        Err(r) => Err(r.error),
    };
    let err = next.unwrap_err();
    assert!(!matches!(err, WorkError::OpTimeout { .. }), "{err}");
    assert!(start.elapsed() < Duration::from_secs(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subgroups_have_their_own_sequence_and_connections() {
    let groups = local_groups(3, T).await;
    let subs = on_all(
        &groups,
        |pg| async move { pg.new_group(&[2, 0]).await.unwrap() },
    )
    .await;
    assert!(subs[1].is_none(), "rank 1 is not in the subgroup");
    let (s0, s2) = (subs[0].clone().unwrap(), subs[2].clone().unwrap());
    assert_eq!(
        (s0.rank(), s2.rank()),
        (1, 0),
        "group rank follows the list order"
    );
    assert_eq!(s0.members(), &[2, 0]);
    let (a, b) = tokio::join!(
        s0.all_reduce(data::<i32>(40, 1, 99, ReduceOp::Sum), ReduceOp::Sum)
            .unwrap(),
        s2.all_reduce(data::<i32>(40, 0, 99, ReduceOp::Sum), ReduceOp::Sum)
            .unwrap(),
    );
    let expect = reference::<i32>(40, 2, 99, ReduceOp::Sum);
    assert_eq!(a.unwrap(), expect);
    assert_eq!(b.unwrap(), expect);
    // The world group is unaffected and its sequence numbers did not move.
    let ws = on_all(&groups, |pg| async move {
        let w = pg.barrier().unwrap();
        let seq = w.seq();
        w.await.unwrap();
        seq
    })
    .await;
    assert_eq!(ws, vec![1, 1, 1]);
    let bad = groups[0].new_group(&[0, 7]).await.unwrap_err();
    assert!(bad.to_string().contains("rank 7"), "{bad}");
}
