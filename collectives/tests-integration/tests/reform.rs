//! Re-forming a group after ranks are lost (`ProcessGroup::reform`): the
//! survivors agree on one roster, renumber densely, and their next
//! all_reduce matches the serial reference; a rank that comes back after
//! the roster closed is voted out; old subgroups fail naming the re-form.
//! The ranks are tasks of this process over loopback; the store is the
//! test's (it outlives every rank, as the launcher's does).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus::store::{ClientOptions, ServerOptions, Store, TcpStore, TcpStoreServer};
use chorus::{ProcessGroup, ReduceOp, ReformError, WorkError};
use tests_integration::testkit::{data, local_groups, reference};

const T: Duration = Duration::from_secs(10);
const WINDOW: Duration = Duration::from_millis(300);
/// Large enough for the ring path: a lost rank is lost mid-op.
const LEN: usize = 100_000;

/// The ranks of `dead` go away mid all_reduce (their groups are aborted and
/// dropped: connections close, as when a process dies); the others see
/// the op fail, re-form, and run a checked all_reduce on the new group.
/// Returns the new groups, by old rank.
async fn lose_and_reform(groups: Vec<ProcessGroup>, dead: &[usize]) -> Vec<Option<ProcessGroup>> {
    let size = groups.len();
    let world = groups[0].members().to_vec();
    let mut works = Vec::new();
    for (r, g) in groups.iter().enumerate() {
        let w = g
            .all_reduce(data::<f32>(1, r, LEN, ReduceOp::Sum), ReduceOp::Sum)
            .unwrap();
        works.push(Some(w));
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    for &d in dead {
        groups[d].abort("this rank dies");
        works[d] = None;
    }
    let mut tasks = Vec::new();
    for (r, (g, w)) in groups.into_iter().zip(works).enumerate() {
        if dead.contains(&r) {
            drop(g);
            tasks.push(None);
            continue;
        }
        let w = w.expect("survivor's work");
        tasks.push(Some(tokio::spawn(async move {
            // The op may have finished before the loss reached it; either
            // way the survivors re-form (a failed one gives its buffer back).
            if let Err(f) = w.await {
                assert!(
                    matches!(
                        f.error(),
                        WorkError::PeerLost { .. }
                            | WorkError::Aborted { .. }
                            | WorkError::Remote { .. }
                    ),
                    "rank {r}: {f}"
                );
                assert_eq!(f.into_buffers().map(|b| b.len()), Some(LEN));
            }
            let t0 = Instant::now();
            let new = tokio::time::timeout(T, g.reform(WINDOW))
                .await
                .expect("reform is bounded")
                .unwrap_or_else(|e| panic!("rank {r}: {e}"));
            (new, t0.elapsed())
        })));
    }
    let mut out = Vec::new();
    for t in tasks {
        match t {
            None => out.push(None),
            Some(t) => {
                let (g, _took) = t.await.expect("survivor task");
                out.push(Some(g));
            }
        }
    }
    let alive: Vec<usize> = (0..size).filter(|r| !dead.contains(r)).collect();
    let members: Vec<usize> = alive.iter().map(|&r| world[r]).collect();
    check_next_all_reduce(&out, &alive, &members).await;
    out
}

/// Every new group has the survivors, densely renumbered in old-rank
/// order, and an all_reduce on it matches the serial reference.
async fn check_next_all_reduce(new: &[Option<ProcessGroup>], alive: &[usize], members: &[usize]) {
    let n = alive.len();
    let mut works = Vec::new();
    for (i, &old) in alive.iter().enumerate() {
        let g = new[old].as_ref().expect("a survivor's new group");
        assert_eq!(
            (g.rank(), g.size()),
            (i, n),
            "old rank {old}: dense renumbering"
        );
        assert_eq!(g.members(), members, "members keep their world ranks");
        assert!(g.epoch() >= 1);
        let case = 100 + g.epoch();
        works.push(
            g.all_reduce(data::<f32>(case, i, 4099, ReduceOp::Sum), ReduceOp::Sum)
                .unwrap(),
        );
    }
    let want = reference::<f32>(
        100 + new[alive[0]].as_ref().unwrap().epoch(),
        n,
        4099,
        ReduceOp::Sum,
    );
    for w in works {
        let got = tokio::time::timeout(T, w)
            .await
            .expect("bounded")
            .expect("all_reduce on the new group");
        assert_eq!(got, want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_ranks_one_dies_mid_all_reduce() {
    lose_and_reform(local_groups(3, T).await, &[2]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_ranks_one_dies_then_another_at_the_next_epoch() {
    let new = lose_and_reform(local_groups(4, T).await, &[1]).await;
    let groups: Vec<ProcessGroup> = new.into_iter().flatten().collect();
    assert!(groups
        .iter()
        .all(|g| g.epoch() == 1 && g.name() == "world@1"));
    // Old ranks 0, 2, 3 are now 0, 1, 2; new rank 1 (old 2) dies next.
    let again = lose_and_reform(groups, &[1]).await;
    let g = again[0].as_ref().expect("rank 0 survives");
    assert_eq!((g.epoch(), g.members()), (2, &[0, 3][..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_ranks_two_die_at_once() {
    lose_and_reform(local_groups(4, T).await, &[1, 3]).await;
}

/// Rank 0 dies; the store is a TCP store server the test owns (as
/// chorus-run's launcher owns the job's), so it outlives rank 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rank_0_dies_and_the_store_outlives_it() {
    let server = TcpStoreServer::bind("127.0.0.1:0".parse().unwrap(), ServerOptions::default())
        .await
        .unwrap();
    let addr = server.local_addr().to_string();
    let size = 4;
    let mut handles = Vec::new();
    for rank in 0..size {
        let addr = addr.clone();
        handles.push(tokio::spawn(async move {
            let store: Arc<dyn Store> = Arc::new(
                TcpStore::connect(&addr, ClientOptions::default())
                    .await
                    .unwrap(),
            );
            ProcessGroup::builder()
                .rank(rank)
                .world_size(size)
                .store(store)
                .timeout(T)
                .build()
                .await
                .unwrap()
        }));
    }
    let mut groups = Vec::new();
    for h in handles {
        groups.push(h.await.unwrap());
    }
    lose_and_reform(groups, &[0]).await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_back_after_the_roster_closed_is_voted_out() {
    let groups = local_groups(3, T).await;
    let mut works: Vec<_> = groups
        .iter()
        .enumerate()
        .map(|(r, g)| {
            // Rank 1 is stopped: it never submits, the others wait for it.
            (r != 1).then(|| {
                g.with_timeout(Duration::from_millis(300))
                    .all_reduce(vec![r as f32; 8], ReduceOp::Sum)
                    .unwrap()
            })
        })
        .collect();
    let mut tasks = Vec::new();
    for r in [0, 2] {
        let g = groups[r].clone();
        let w = works[r].take().unwrap();
        tasks.push(tokio::spawn(async move {
            let f = w.await.unwrap_err();
            assert!(
                matches!(
                    f.error(),
                    WorkError::OpTimeout { .. }
                        | WorkError::PeerLost { .. }
                        | WorkError::Remote { .. }
                ),
                "rank {r}: {f}"
            );
            g.reform(WINDOW).await
        }));
    }
    let mut new = Vec::new();
    for t in tasks {
        new.push(t.await.unwrap().expect("the survivors re-form"));
    }
    assert_eq!(new[0].members(), &[0, 2]);
    // Rank 1 wakes up: its next op fails (its peers are gone), and its
    // re-form finds the roster closed without it, at once.
    let stopped = &groups[1];
    let r = stopped
        .all_reduce(vec![1.0f32; 8], ReduceOp::Sum)
        .unwrap()
        .await;
    assert!(r.is_err(), "its old group is gone");
    let t0 = Instant::now();
    match stopped.reform(WINDOW).await {
        Err(ReformError::VotedOut {
            rank,
            epoch,
            members,
            ..
        }) => {
            assert_eq!((rank, epoch, members), (1, 1, vec![0, 2]));
        }
        other => panic!("expected VotedOut, got {other:?}"),
    }
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "no waiting out a window: {:?}",
        t0.elapsed()
    );
    // The survivors' new group is not disturbed.
    check_next_all_reduce(
        &[Some(new[0].clone()), None, Some(new[1].clone())],
        &[0, 2],
        &[0, 2],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_subgroups_fail_naming_the_reform() {
    let groups = local_groups(3, T).await;
    let subs: Vec<Option<ProcessGroup>> = {
        let mut t = Vec::new();
        for g in &groups {
            let g = g.clone();
            t.push(tokio::spawn(
                async move { g.new_group(&[0, 1]).await.unwrap() },
            ));
        }
        let mut out = Vec::new();
        for h in t {
            out.push(h.await.unwrap());
        }
        out
    };
    // Every rank alive: the quorum closes as soon as all announced.
    let mut tasks = Vec::new();
    for g in groups.clone() {
        tasks.push(tokio::spawn(async move {
            g.reform(Duration::from_secs(30)).await
        }));
    }
    let t0 = Instant::now();
    for t in tasks {
        let g = t.await.unwrap().unwrap();
        assert_eq!(g.size(), 3);
    }
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "no waiting out the window when all are there"
    );
    let sub = subs[0].as_ref().expect("rank 0 is in the subgroup");
    let err = match sub.all_reduce(vec![1.0f32; 4], ReduceOp::Sum) {
        Err(r) => r.error,
        Ok(w) => w.await.unwrap_err().into_error(),
    };
    assert!(err.to_string().contains("re-formed"), "{err}");
    // The old group itself refuses work too.
    let old = groups[0].barrier().unwrap_err();
    assert!(old.error.to_string().contains("re-formed"), "{}", old.error);
}
