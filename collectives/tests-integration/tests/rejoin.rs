//! Replacement ranks rejoining a running group (`GroupBuilder::rejoin`,
//! `ProcessGroup::admit`): one that announces while the survivors re-form
//! is counted in at once; one that comes later is let in by `admit` at a
//! step boundary; nobody waiting leaves the group as it is; one that no
//! epoch admits gets `NotAdmitted` within its timeout. The ranks are tasks
//! of this process over loopback; the store is the test's (it outlives
//! every rank, as the launcher's does).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus::store::{InMemoryStore, Store};
use chorus::{ProcessGroup, ReduceOp, ReformError, WorkError};
use tests_integration::testkit::{data, local_groups_on, reference};

const T: Duration = Duration::from_secs(10);
const WINDOW: Duration = Duration::from_millis(2_000);

fn joiner(rank: usize, size: usize, store: &Arc<dyn Store>, wait: Duration) -> JoinTask {
    let b = ProcessGroup::builder()
        .rank(rank)
        .world_size(size)
        .store(store.clone())
        .timeout(T)
        .rejoin_timeout(wait);
    tokio::spawn(b.rejoin())
}

/// A replacement rank's rejoin, running.
type JoinTask = tokio::task::JoinHandle<Result<ProcessGroup, chorus::Error>>;

/// A checked all_reduce on every group of one epoch, and their world ranks.
async fn check(gs: &[ProcessGroup]) -> Vec<usize> {
    let n = gs.len();
    let case = 40 + gs[0].epoch();
    let works: Vec<_> = gs
        .iter()
        .map(|g| {
            assert_eq!(g.size(), n);
            g.all_reduce(
                data::<f32>(case, g.rank(), 999, ReduceOp::Sum),
                ReduceOp::Sum,
            )
            .unwrap()
        })
        .collect();
    for w in works {
        assert_eq!(
            w.await.unwrap(),
            reference::<f32>(case, n, 999, ReduceOp::Sum)
        );
    }
    gs[0].members().to_vec()
}

/// The first `admit` of every member of a group with replacements: each
/// returns its group at once.
async fn admit_all(gs: Vec<ProcessGroup>) -> Vec<ProcessGroup> {
    let t0 = Instant::now();
    let tasks: Vec<_> = gs
        .into_iter()
        .map(|g| tokio::spawn(async move { g.admit(WINDOW).await }))
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(
            t.await
                .unwrap()
                .expect("admit")
                .expect("the first admit of a group with replacements returns it"),
        );
    }
    assert!(t0.elapsed() < WINDOW, "no exchange: {:?}", t0.elapsed());
    out
}

/// Survivors `gs` re-form concurrently; returns their new groups.
async fn reform_all(gs: Vec<ProcessGroup>) -> Vec<ProcessGroup> {
    let tasks: Vec<_> = gs
        .into_iter()
        .map(|g| tokio::spawn(async move { g.reform(WINDOW).await }))
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap().expect("re-formed"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_announced_during_the_reform_is_counted_in_at_once() {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let mut gs = local_groups_on(3, &store, T).await;
    let dead = gs.remove(1);
    dead.abort("this rank dies");
    drop(dead);
    let j = joiner(1, 3, &store, T);
    let t0 = Instant::now();
    let mut new = reform_all(gs).await;
    // The replacement of every missing member is in: no window waited.
    assert!(t0.elapsed() < WINDOW, "{:?}", t0.elapsed());
    let j = j.await.unwrap().expect("admitted");
    assert_eq!((j.rank(), j.epoch()), (2, 1));
    new.push(j);
    for (i, g) in new.iter().enumerate() {
        assert_eq!(g.rank(), i);
    }
    // A group with a replacement refuses ops until admit returned it, on
    // every member alike; then its first admit returns it at once.
    for g in &new {
        let e = g.all_reduce(vec![1.0f32], ReduceOp::Sum).unwrap_err();
        assert!(
            matches!(e.error, WorkError::NotAdmitted { .. }),
            "{}",
            e.error
        );
    }
    let new = admit_all(new).await;
    // Survivors in old order, then the joiner by world rank.
    assert_eq!(check(&new).await, vec![0, 2, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_replacement_is_admitted_at_a_step_boundary() {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let mut gs = local_groups_on(4, &store, T).await;
    let dead = gs.remove(0);
    dead.abort("this rank dies");
    drop(dead);
    let gs: Vec<ProcessGroup> = {
        let tasks: Vec<_> = gs
            .into_iter()
            .map(|g| tokio::spawn(async move { g.reform(Duration::from_millis(200)).await }))
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap().unwrap());
        }
        out
    };
    assert_eq!(check(&gs).await, vec![1, 2, 3]);
    // Nobody waits: every member keeps the group.
    let admits: Vec<_> = gs
        .iter()
        .cloned()
        .map(|g| tokio::spawn(async move { g.admit(WINDOW).await.map(|o| o.is_none()) }))
        .collect();
    for a in admits {
        assert!(a.await.unwrap().unwrap(), "no joiner: the group stays");
    }
    // World rank 0 comes back; the members admit it at their next step.
    let j = joiner(0, 4, &store, T);
    let mut grown: Vec<ProcessGroup> = Vec::new();
    for _ in 0..200 {
        let admits: Vec<_> = gs
            .iter()
            .cloned()
            .map(|g| tokio::spawn(async move { g.admit(WINDOW).await }))
            .collect();
        let mut out = Vec::new();
        for a in admits {
            out.push(a.await.unwrap().expect("admit"));
        }
        if out.iter().all(Option::is_some) {
            grown = out.into_iter().flatten().collect();
            break;
        }
        assert!(
            out.iter().all(Option::is_none),
            "every member decides alike"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(grown.len(), 3, "the replacement was admitted");
    let j = j.await.unwrap().expect("admitted");
    assert_eq!((j.rank(), j.epoch()), (3, 2));
    // The members' admit returned the grown group; the replacement's first
    // admit returns its own at once.
    let j = j
        .admit(WINDOW)
        .await
        .expect("admit")
        .expect("its first admit returns its group");
    grown.push(j);
    assert_eq!(check(&grown).await, vec![1, 2, 3, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_nobody_admits_gets_not_admitted_in_time() {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let gs = local_groups_on(2, &store, T).await;
    let t0 = Instant::now();
    let e = joiner(1, 2, &store, Duration::from_millis(300))
        .await
        .unwrap()
        .expect_err("nobody admits it");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert!(
        matches!(
            &e,
            chorus::Error::Reform(ReformError::NotAdmitted {
                world_rank: 1,
                epoch: 1,
                ..
            })
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("admit"),
        "the error says what to do: {e}"
    );
    drop(gs);
}
