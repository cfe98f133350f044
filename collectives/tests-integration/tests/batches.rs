//! Batched ops on the TCP backend: mixed ops and dtypes against
//! the serial reference, fused all_reduces, a bad argument that leaves the
//! batch usable, dropped batches, and batches that differ across ranks.
#![forbid(unsafe_code)]

use std::time::Duration;

use chorus::{ProcessGroup, ReduceOp, WorkError};
use half::bf16;
use tests_integration::testkit::{data, local_groups, on_all, poison, reference};

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_ops_and_dtypes_in_one_batch_match_the_reference() {
    for n in [1usize, 3] {
        let groups = local_groups(n, T).await;
        on_all(&groups, move |pg| async move {
            let r = pg.rank();
            let next = (r + 1) % n;
            let prev = (r + n - 1) % n;
            // A batch is `!Send`: stage and launch it in a block that ends
            // before the first await.
            let (a, b, c, d, e, f, h, p2p, i) = {
                let mut g = pg.batch();
                // Two f32 sums in a row (fused on TCP), then an i64 max.
                let a = g
                    .all_reduce(data::<f32>(1, r, 1000, ReduceOp::Sum), ReduceOp::Sum)
                    .unwrap();
                let b = g
                    .all_reduce(data::<f32>(2, r, 7, ReduceOp::Sum), ReduceOp::Sum)
                    .unwrap();
                let c = g
                    .all_reduce(data::<i64>(3, r, 13, ReduceOp::Max), ReduceOp::Max)
                    .unwrap();
                let d = g
                    .broadcast(data::<u8>(4, r, 31, ReduceOp::Sum), n - 1)
                    .unwrap();
                let e = g
                    .all_gather(data::<f64>(5, r, 5, ReduceOp::Sum), poison::<f64>(5 * n))
                    .unwrap();
                let f = g
                    .reduce_scatter(
                        data::<i32>(6, r, 4 * n, ReduceOp::Min),
                        poison::<i32>(4),
                        ReduceOp::Min,
                    )
                    .unwrap();
                let h = g
                    .all_to_all(
                        data::<bf16>(7, r, 3 * n, ReduceOp::Sum),
                        poison::<bf16>(3 * n),
                    )
                    .unwrap();
                // A ring of messages, the recv staged before the send.
                let p2p = (n > 1).then(|| {
                    let rx = g.recv(poison::<f32>(9), prev).unwrap();
                    let tx = g.send(data::<f32>(8, r, 9, ReduceOp::Sum), next).unwrap();
                    (rx, tx)
                });
                let i = g
                    .all_reduce(data::<f32>(10, r, 3, ReduceOp::Avg), ReduceOp::Avg)
                    .unwrap();
                assert_eq!(g.len(), if n > 1 { 10 } else { 8 });
                g.launch().unwrap();
                (a, b, c, d, e, f, h, p2p, i)
            };

            assert_eq!(
                a.await.unwrap(),
                reference::<f32>(1, n, 1000, ReduceOp::Sum)
            );
            assert_eq!(b.await.unwrap(), reference::<f32>(2, n, 7, ReduceOp::Sum));
            assert_eq!(c.await.unwrap(), reference::<i64>(3, n, 13, ReduceOp::Max));
            assert_eq!(d.await.unwrap(), data::<u8>(4, n - 1, 31, ReduceOp::Sum));
            let (_, out) = e.await.unwrap();
            let want: Vec<f64> = (0..n)
                .flat_map(|q| data::<f64>(5, q, 5, ReduceOp::Sum))
                .collect();
            assert_eq!(out, want);
            let (_, out) = f.await.unwrap();
            let full = reference::<i32>(6, n, 4 * n, ReduceOp::Min);
            assert_eq!(out, full[4 * r..4 * r + 4].to_vec());
            let (_, out) = h.await.unwrap();
            let want: Vec<bf16> = (0..n)
                .flat_map(|q| data::<bf16>(7, q, 3 * n, ReduceOp::Sum)[3 * r..3 * r + 3].to_vec())
                .collect();
            assert_eq!(out, want);
            if let Some((rx, tx)) = p2p {
                assert_eq!(rx.await.unwrap(), data::<f32>(8, prev, 9, ReduceOp::Sum));
                assert_eq!(tx.await.unwrap(), data::<f32>(8, r, 9, ReduceOp::Sum));
            }
            assert_eq!(i.await.unwrap(), reference::<f32>(10, n, 3, ReduceOp::Avg));
            // The group took one sequence number per collective: a plain op
            // afterwards still matches across ranks.
            let w = pg.all_reduce(vec![1i32; 4], ReduceOp::Sum).unwrap();
            assert_eq!(w.seq(), 9);
            assert_eq!(w.await.unwrap(), vec![n as i32; 4]);
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_argument_fails_cleanly_and_the_next_batch_works() {
    let groups = local_groups(2, T).await;
    on_all(&groups, |pg| async move {
        let r = pg.rank();
        let mut staged = None;
        let res = pg.batched(|g| {
            staged = Some(g.all_reduce(data::<f32>(1, r, 10, ReduceOp::Sum), ReduceOp::Sum)?);

            // Root 7 is not a rank of a group of 2: refused with the buffer.
            match g.broadcast(data::<i32>(2, r, 5, ReduceOp::Sum), 7) {
                Ok(_) => panic!("root 7 was accepted"),
                Err(rej) => {
                    assert_eq!(rej.buffers, data::<i32>(2, r, 5, ReduceOp::Sum));
                    assert!(rej.error.to_string().contains("root 7"), "{}", rej.error);
                    Err(rej.error)
                }
            }?;
            Ok::<_, WorkError>(())
        });
        assert!(matches!(res, Err(WorkError::InvalidArgument { .. })));
        // The batch was dropped: its staged op never ran and says so.
        let err = staged.unwrap().await.unwrap_err();
        assert!(err.to_string().contains("dropped before launch"), "{err}");
        assert!(
            pg.error().is_none(),
            "an invalid argument must not fail the group"
        );

        // The next batch runs, with the sequence numbers in step.
        let (a, b) = pg
            .batched(|g| {
                Ok::<_, chorus::Error>((
                    g.all_reduce(data::<f32>(3, r, 10, ReduceOp::Sum), ReduceOp::Sum)?,
                    g.all_gather(vec![r as u8; 2], vec![0u8; 4])?,
                ))
            })
            .unwrap();
        assert_eq!(a.await.unwrap(), reference::<f32>(3, 2, 10, ReduceOp::Sum));
        assert_eq!(b.await.unwrap().1, vec![0, 0, 1, 1]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_of_an_unlaunched_batch_say_so() {
    let groups = local_groups(1, T).await;
    let pg: ProcessGroup = groups[0].clone();
    let mut g = pg.batch();
    let a = g.all_reduce(vec![1.0f32; 3], ReduceOp::Sum).unwrap();
    let b = g.all_reduce(vec![2.0f32; 3], ReduceOp::Sum).unwrap();
    // Taken before launch: an error, and the op still runs with its batch.
    let err = a.into_work().unwrap_err();
    assert!(err.to_string().contains("not been launched"), "{err}");
    g.launch().unwrap();
    assert_eq!(b.into_work().unwrap().await.unwrap(), vec![2.0f32; 3]);
    // An empty batch launches nothing.
    pg.batch().launch().unwrap();
    assert_eq!(pg.all_reduce(vec![5u8], ReduceOp::Sum).unwrap().seq(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_that_differs_across_ranks_is_a_named_mismatch() {
    let groups = local_groups(2, T).await;
    let errs = on_all(&groups, |pg| async move {
        // A submission may already be refused: the group can have failed
        // on the mismatch by then (GroupErrored naming it).
        let first_error = |a: Option<WorkError>, b: Option<WorkError>| a.or(b);
        if pg.rank() == 0 {
            let staged = pg.batched(|g| {
                Ok::<_, WorkError>((
                    g.all_reduce(vec![1.0f32; 10], ReduceOp::Sum)?,
                    g.all_reduce(vec![1.0f32; 12], ReduceOp::Sum)?,
                ))
            });
            match staged {
                Ok((a, b)) => first_error(
                    a.await.err().map(|f| f.error),
                    b.await.err().map(|f| f.error),
                ),
                Err(e) => Some(e),
            }
        } else {
            let a = pg.all_reduce(vec![1.0f32; 10], ReduceOp::Sum);
            let b = pg.all_reduce(vec![1.0f32; 12], ReduceOp::Sum);
            let a = match a {
                Ok(w) => w.await.err().map(|f| f.error),
                Err(r) => Some(r.error),
            };
            let b = match b {
                Ok(w) => w.await.err().map(|f| f.error),
                Err(r) => Some(r.error),
            };
            first_error(a, b)
        }
    })
    .await;
    for e in errs {
        let e = e.expect("the ranks batched differently and must not agree");
        let named = |e: &WorkError| {
            matches!(e, WorkError::Mismatch { .. }) || matches!(e, WorkError::PeerLost { .. })
        };
        let ok = match &e {
            WorkError::GroupErrored { cause, .. } => named(cause),
            e => named(e),
        };
        assert!(ok, "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coalesced_all_reduce_matches_the_reference_and_takes_one_seq() {
    for n in [1usize, 3] {
        let groups = local_groups(n, T).await;
        on_all(&groups, move |pg| async move {
            let r = pg.rank();
            // Lengths 0, 1, a prime and a larger one, each its own data.
            let lens = [5usize, 0, 1, 13, 1000];
            for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg] {
                let bufs: Vec<Vec<f32>> = lens
                    .iter()
                    .enumerate()
                    .map(|(i, &len)| data::<f32>(20 + i as u64, r, len, op))
                    .collect();
                let w = pg.all_reduce_coalesced(bufs, op).unwrap();
                let seq = w.seq();
                let got = w.await.unwrap();
                assert_eq!(got.len(), lens.len());
                for (i, (&len, g)) in lens.iter().zip(&got).enumerate() {
                    assert_eq!(
                        *g,
                        reference::<f32>(20 + i as u64, n, len, op),
                        "buffer {i}"
                    );
                }
                // One sequence number for the whole op.
                let next = pg.all_reduce(vec![1i64; 2], ReduceOp::Sum).unwrap();
                assert_eq!(next.seq(), seq + 1);
                assert_eq!(next.await.unwrap(), vec![n as i64; 2]);
            }
            // No buffer: refused, nothing taken, the group still works.
            let rej = pg
                .all_reduce_coalesced(Vec::<Vec<f32>>::new(), ReduceOp::Sum)
                .unwrap_err();
            assert!(
                matches!(rej.error, WorkError::InvalidArgument { .. }),
                "{}",
                rej.error
            );
            assert!(
                rej.error.to_string().contains("all_reduce_coalesced"),
                "{}",
                rej.error
            );
            let w = pg
                .all_reduce_coalesced(vec![vec![2u8; 3]], ReduceOp::Sum)
                .unwrap();
            assert_eq!(w.await.unwrap(), vec![vec![2 * n as u8; 3]]);
        })
        .await;
    }
}
