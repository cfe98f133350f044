//! Who a rank is, as `ProcessGroup` tells it: its world rank in every
//! group (world, subgroups, re-formed groups), how often the launcher
//! restarted it, and whether it is a replacement that rejoined. The
//! ranks are tasks of this process; the store is the test's.

use std::sync::Arc;
use std::time::Duration;

use chorus::store::{InMemoryStore, Store};
use chorus::ProcessGroup;
use tests_integration::testkit::local_groups_on;

const T: Duration = Duration::from_secs(10);

/// A subgroup of world ranks 3 and 1 (in that order): their group ranks
/// are 0 and 1, their world ranks stay 3 and 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_world_rank_is_the_same_in_every_group() {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let gs = local_groups_on(4, &store, T).await;
    for (r, g) in gs.iter().enumerate() {
        assert_eq!((g.rank(), g.world_rank()), (r, r));
        assert_eq!(g.restarts(), 0, "the builder's test runs no launcher");
        assert!(!g.is_replacement());
    }
    let subs: Vec<_> = gs
        .iter()
        .cloned()
        .map(|g| tokio::spawn(async move { g.new_group(&[3, 1]).await }))
        .collect();
    let mut got = Vec::new();
    for (r, s) in subs.into_iter().enumerate() {
        if let Some(sub) = s.await.unwrap().expect("new_group") {
            assert_eq!(sub.world_rank(), r);
            assert_eq!(sub.members()[sub.rank()], r);
            assert!(!sub.is_replacement());
            got.push((sub.rank(), sub.world_rank()));
        }
    }
    got.sort();
    assert_eq!(got, vec![(0, 3), (1, 1)]);
}

/// Rank 1 dies and a replacement rejoins while the survivors re-form: it
/// is a replacement, and stays one in the groups made from its group; the
/// survivors are not, and keep their world ranks under new ranks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_knows_it_is_one_and_the_survivors_that_they_are_not() {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let mut gs = local_groups_on(3, &store, T).await;
    let dead = gs.remove(1);
    dead.abort("this rank dies");
    drop(dead);
    let joiner = tokio::spawn(
        ProcessGroup::builder()
            .rank(1)
            .world_size(3)
            .store(store.clone())
            .timeout(T)
            .rejoin_timeout(T)
            .rejoin(),
    );
    let reforms: Vec<_> = gs
        .into_iter()
        .map(|g| tokio::spawn(async move { g.reform(Duration::from_secs(2)).await }))
        .collect();
    let mut new = Vec::new();
    for t in reforms {
        new.push(t.await.unwrap().expect("re-formed"));
    }
    new.push(joiner.await.unwrap().expect("admitted"));
    // Survivors in old order, then the replacement: group ranks 0, 1, 2
    // for world ranks 0, 2, 1.
    let seen: Vec<_> = new
        .iter()
        .map(|g| (g.rank(), g.world_rank(), g.is_replacement(), g.epoch()))
        .collect();
    assert_eq!(
        seen,
        vec![(0, 0, false, 1), (1, 2, false, 1), (2, 1, true, 1)]
    );
    // A subgroup of the grown group keeps the answer.
    let subs: Vec<_> = new
        .iter()
        .cloned()
        .map(|g| tokio::spawn(async move { g.new_group(&[1, 2]).await }))
        .collect();
    let mut got = Vec::new();
    for s in subs {
        if let Some(sub) = s.await.unwrap().expect("new_group") {
            got.push((sub.world_rank(), sub.is_replacement()));
        }
    }
    got.sort();
    assert_eq!(got, vec![(1, true), (2, false)]);
}
