//! Rendezvous of ranks running as tasks and threads of one process: joining,
//! the shared store, ranks that never arrive, leaving, misconfigurations.
//! (Ranks in separate processes under chorus-run: `rendezvous_procs.rs`.)
#![forbid(unsafe_code)]

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chorus_store::rendezvous::{
    rejoin, rendezvous, Rendezvous, RendezvousConfig, RendezvousConfigBuilder, RendezvousError,
};
use chorus_store::StoreError;
use futures::future::join_all;
use rand::{Rng, SeedableRng};

/// A port free on 127.0.0.1 a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn cfg(rank: usize, world: usize, port: u16, timeout_ms: u64) -> RendezvousConfig {
    RendezvousConfig::builder()
        .rank(rank)
        .world_size(world)
        .local_rank(rank % 4)
        .local_world_size(4.min(world))
        .master_addr("127.0.0.1")
        .master_port(port)
        .timeout(Duration::from_millis(timeout_ms))
        .shutdown_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

async fn join_ranks(
    ranks: &[usize],
    world: usize,
    port: u16,
    timeout_ms: u64,
) -> Vec<Result<Rendezvous, RendezvousError>> {
    join_all(
        ranks
            .iter()
            .map(|&r| rendezvous(cfg(r, world, port, timeout_ms))),
    )
    .await
}

/// Every rank of a `world` on `127.0.0.1:port` joins (10 s timeout), each
/// configured further by `more`.
async fn join_world(
    world: usize,
    port: u16,
    more: impl Fn(RendezvousConfigBuilder) -> RendezvousConfigBuilder,
) -> Vec<Rendezvous> {
    join_all((0..world).map(|r| {
        let b = RendezvousConfig::builder()
            .rank(r)
            .world_size(world)
            .master_addr("127.0.0.1")
            .master_port(port)
            .timeout(Duration::from_secs(10));
        rendezvous(more(b).build().unwrap())
    }))
    .await
    .into_iter()
    .map(Result::unwrap)
    .collect()
}

#[tokio::test]
async fn eight_ranks_join_and_share_the_store() {
    let world = 8;
    let port = free_port();
    // Start the ranks in a shuffled order: rank 0 need not be first.
    let mut order: Vec<usize> = (0..world).collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for i in (1..world).rev() {
        order.swap(i, rng.gen_range(0..=i));
    }
    let joined = join_ranks(&order, world, port, 10_000).await;
    let ranks: Vec<Rendezvous> = joined.into_iter().map(Result::unwrap).collect();
    for (r, &want) in ranks.iter().zip(&order) {
        assert_eq!((r.rank(), r.world_size()), (want, world));
        assert_eq!((r.local_rank(), r.local_world_size()), (want % 4, 4));
    }
    // Every rank writes a random value; every rank reads all of them.
    let values: Vec<Vec<u8>> = (0..world).map(|_| rng.gen::<[u8; 16]>().to_vec()).collect();
    join_all(ranks.iter().map(|r| {
        let v = values[r.rank()].clone();
        async move { r.store().set(&format!("v/{}", r.rank()), &v).await.unwrap() }
    }))
    .await;
    let keys: Vec<String> = (0..world).map(|i| format!("v/{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    for r in &ranks {
        let got = r
            .store()
            .multi_get(&keys, Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(got, values, "rank {} sees other values", r.rank());
    }
    for res in join_all(ranks.into_iter().map(Rendezvous::shutdown)).await {
        res.unwrap();
    }
}

#[tokio::test]
async fn a_rank_that_never_arrives_is_named() {
    let port = free_port();
    // Rank 2 of 4 never starts.
    let results = join_ranks(&[0, 1, 3], 4, port, 1000).await;
    for res in results {
        let e = res.expect_err("join must fail without rank 2");
        assert!(
            matches!(&e, RendezvousError::NeverJoined { missing, world_size: 4, .. } if missing == &[2]),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "ranks [2] of 4 never joined within 1s; did they start, with the same MASTER_ADDR/MASTER_PORT?"
        );
    }
}

#[tokio::test]
async fn several_missing_ranks_are_all_named() {
    let port = free_port();
    let results = join_ranks(&[0, 2, 4, 5, 6], 8, port, 800).await;
    for res in results {
        match res {
            Err(RendezvousError::NeverJoined { missing, .. }) => assert_eq!(missing, [1, 3, 7]),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn works_from_block_on_in_threads() {
    // No tokio runtime on these threads: chorus runs the I/O itself.
    let world = 4;
    let port = free_port();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let adds: Vec<i64> = (0..world).map(|_| rng.gen_range(-1000..1000)).collect();
    let threads: Vec<_> = (0..world)
        .map(|r| {
            let adds = adds.clone();
            std::thread::spawn(move || {
                futures::executor::block_on(async move {
                    let rdzv = rendezvous(cfg(r, world, port, 10_000)).await.unwrap();
                    let store = rdzv.store();
                    store.add("sum", adds[r]).await.unwrap();
                    store.set(&format!("added/{r}"), b"").await.unwrap();
                    let keys: Vec<String> = (0..world).map(|i| format!("added/{i}")).collect();
                    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                    store.wait(&keys, Duration::from_secs(10)).await.unwrap();
                    let sum = store.add("sum", 0).await.unwrap();
                    rdzv.shutdown().await.unwrap();
                    sum
                })
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), adds.iter().sum::<i64>());
    }
}

#[test]
fn a_single_rank_needs_no_port() {
    let c = RendezvousConfig::builder()
        .rank(0)
        .world_size(1)
        .build()
        .unwrap();
    futures::executor::block_on(async {
        let rdzv = rendezvous(c).await.unwrap();
        assert!(!rdzv.store_addr().ends_with(":0"), "{}", rdzv.store_addr());
        rdzv.store().set("k", b"v").await.unwrap();
        assert_eq!(
            rdzv.store().get("k", Duration::from_secs(1)).await.unwrap(),
            b"v"
        );
        rdzv.shutdown().await.unwrap();
    });
}

#[tokio::test]
async fn rank_0_keeps_the_store_until_everyone_left() {
    let port = free_port();
    let mut ranks: Vec<Rendezvous> = join_ranks(&[0, 1, 2], 3, port, 10_000)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let r2 = ranks.pop().unwrap();
    let r1 = ranks.pop().unwrap();
    let r0 = ranks.pop().unwrap();
    // Rank 0 is done first.
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let leaving = tokio::spawn(async move {
        let r = r0.shutdown().await;
        d.store(true, Ordering::SeqCst);
        r
    });
    // The others still use the store, then leave; rank 0's shutdown cannot
    // return before they have.
    let s1 = r1.store();
    let s2 = r2.store();
    s1.set("late", b"still here").await.unwrap();
    assert_eq!(
        s2.get("late", Duration::from_secs(5)).await.unwrap(),
        b"still here"
    );
    r1.shutdown().await.unwrap();
    assert_eq!(s2.add("n", 5).await.unwrap(), 5);
    assert!(
        !done.load(Ordering::SeqCst),
        "rank 0 stopped the store while rank 2 was in"
    );
    drop(s1);
    r2.shutdown().await.unwrap();
    leaving.await.unwrap().unwrap();
    // The server is gone now.
    assert!(s2.set("after", b"x").await.is_err());
}

#[tokio::test]
async fn dropping_the_store_leaves_the_job() {
    let port = free_port();
    let mut ranks: Vec<Rendezvous> = join_ranks(&[0, 1], 2, port, 10_000)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let r1 = ranks.pop().unwrap();
    let r0 = ranks.pop().unwrap();
    let store1 = r1.store();
    drop(r1); // a handle is still alive: rank 1 has not left yet
    store1.set("x", b"1").await.unwrap();
    drop(store1); // last handle: rank 1 leaves
    r0.shutdown().await.unwrap();
}

#[tokio::test]
async fn rank_0_dropped_first_keeps_serving_until_the_others_left() {
    let port = free_port();
    let mut ranks: Vec<Rendezvous> = join_ranks(&[0, 1], 2, port, 10_000)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let r1 = ranks.pop().unwrap();
    drop(ranks); // rank 0, without shutdown
    let s1 = r1.store();
    s1.set("k", b"after rank 0 left").await.unwrap();
    assert_eq!(
        s1.get("k", Duration::from_secs(5)).await.unwrap(),
        b"after rank 0 left"
    );
    r1.shutdown().await.unwrap();
    // Now rank 0's background task stops the server: the connection closes.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s1.set("k", b"x").await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "server still up after everyone left"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_rank_that_never_leaves_is_named_at_shutdown() {
    let mut ranks = join_world(3, free_port(), |b| {
        b.shutdown_timeout(Duration::from_millis(300))
    })
    .await;
    let r2 = ranks.pop().unwrap();
    let r1 = ranks.pop().unwrap();
    let r0 = ranks.pop().unwrap();
    r1.shutdown().await.unwrap();
    let e = r0.shutdown().await.unwrap_err();
    assert!(
        matches!(&e, RendezvousError::NeverLeft { missing, world_size: 3, .. } if missing == &[2]),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with("ranks [2] of 3 did not leave within 300ms"),
        "{e}"
    );
    // Rank 2's store is gone with the server.
    assert!(r2.store().set("x", b"1").await.is_err());
}

#[tokio::test]
async fn two_processes_with_one_rank_are_refused() {
    let port = free_port();
    let results = join_ranks(&[0, 1, 1], 3, port, 800).await;
    let dup = results
        .iter()
        .filter(|r| matches!(r, Err(RendezvousError::DuplicateRank { rank: 1 })))
        .count();
    assert_eq!(dup, 1, "{results:?}");
    // The others never see rank 2.
    for r in &results {
        assert!(
            matches!(r, Err(RendezvousError::DuplicateRank { rank: 1 }))
                || matches!(r, Err(RendezvousError::NeverJoined { missing, .. }) if missing == &[2]),
            "{r:?}"
        );
    }
}

#[tokio::test]
async fn different_world_sizes_are_refused() {
    let port = free_port();
    let (a, b) = tokio::join!(
        rendezvous(cfg(0, 2, port, 800)),
        rendezvous(cfg(1, 3, port, 800))
    );
    let errs = [a.unwrap_err(), b.unwrap_err()];
    assert!(
        errs.iter()
            .any(|e| matches!(e, RendezvousError::WorldSizeMismatch { .. })),
        "{errs:?}"
    );
}

#[tokio::test]
async fn a_wrong_token_cannot_join() {
    let port = free_port();
    let with_token = |rank, token: &str| {
        RendezvousConfig::builder()
            .rank(rank)
            .world_size(2)
            .master_addr("127.0.0.1")
            .master_port(port)
            .timeout(Duration::from_millis(800))
            .token(token)
            .build()
            .unwrap()
    };
    let (a, b) = tokio::join!(
        rendezvous(with_token(0, "right")),
        rendezvous(with_token(1, "wrong"))
    );
    assert!(
        matches!(a, Err(RendezvousError::NeverJoined { ref missing, .. }) if missing == &[1]),
        "{a:?}"
    );
    match b {
        Err(RendezvousError::Connect {
            rank: 1,
            cause: StoreError::Auth(_),
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn no_rank_0_means_no_store() {
    let port = free_port();
    let e = rendezvous(cfg(1, 2, port, 300)).await.unwrap_err();
    assert!(
        matches!(e, RendezvousError::Connect { rank: 1, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("store of rank 0"), "{e}");
}

#[tokio::test]
async fn rank_0_reports_a_busy_port() {
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let e = rendezvous(cfg(0, 2, port, 300)).await.unwrap_err();
    assert!(matches!(e, RendezvousError::Host { .. }), "{e:?}");
    assert!(e.to_string().contains("MASTER_PORT"), "{e}");
}

#[tokio::test]
async fn rendezvous_keys_stay_under_their_prefix() {
    // The protocol's keys live under chorus/rdzv/; user keys are untouched.
    let port = free_port();
    let ranks: Vec<Rendezvous> = join_ranks(&[0, 1], 2, port, 10_000)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let s = ranks[1].store();
    assert_eq!(
        s.get("chorus/rdzv/world_size", Duration::from_secs(1))
            .await
            .unwrap(),
        b"2"
    );
    assert_eq!(s.add("chorus/rdzv/joined", 0).await.unwrap(), 2);
    assert!(!s.check(&["joined"]).await.unwrap());
    assert!(!s.check(&["world_size"]).await.unwrap());
    let seen: HashSet<usize> = ranks.iter().map(Rendezvous::rank).collect();
    assert_eq!(seen, HashSet::from([0, 1]));
    for r in join_all(ranks.into_iter().map(Rendezvous::shutdown)).await {
        r.unwrap();
    }
}

#[tokio::test]
async fn a_replacement_rank_reconnects_without_the_join() {
    let port = free_port();
    let joined = join_ranks(&[0, 1, 2], 3, port, 5_000).await;
    let joined: Vec<Rendezvous> = joined.into_iter().map(Result::unwrap).collect();
    joined[0].store().set("seen", b"yes").await.unwrap();
    // Rank 1 again (as a launcher's restart would start it): the join
    // protocol would refuse it as a duplicate; rejoin reconnects.
    let again = rejoin(cfg(1, 3, port, 2_000)).await.unwrap();
    assert_eq!(again.rank(), 1);
    let v = again.store().get("seen", Duration::from_secs(1)).await;
    assert_eq!(v.unwrap(), b"yes");
    // Another world size is refused.
    let e = rejoin(cfg(1, 4, port, 2_000)).await.unwrap_err();
    assert!(
        matches!(e, RendezvousError::WorldSizeMismatch { ours: 4, .. }),
        "{e}"
    );
    // Rank 0 hosted this store: its replacement would find none.
    let e = rejoin(cfg(0, 3, port, 2_000)).await.unwrap_err();
    assert!(
        matches!(e, RendezvousError::NoRejoin { rank: 0, .. }),
        "{e}"
    );
    drop(again);
    let mut left = joined.into_iter();
    let zero = left.next().unwrap();
    for r in left {
        r.shutdown().await.unwrap();
    }
    zero.shutdown().await.unwrap();
}

#[tokio::test]
async fn rejoining_a_job_that_never_started_is_refused() {
    let port = free_port();
    // A store with no job in it.
    let server = chorus_store::TcpStoreServer::bind(
        format!("127.0.0.1:{port}").parse().unwrap(),
        Default::default(),
    )
    .await
    .unwrap();
    let e = rejoin(cfg(2, 3, port, 2_000)).await.unwrap_err();
    assert!(
        matches!(&e, RendezvousError::WorldSizeMismatch { ours: 3, theirs } if theirs.contains("no rank joined")),
        "{e}"
    );
    server.shutdown().await;
}

/// A job of `world` ranks whose store a test-owned server serves, as
/// chorus-run's does (`CHORUS_STORE_HOST=launcher`): the server, the
/// joined ranks and the launcher's own client.
async fn launcher_job(
    world: usize,
) -> (
    chorus_store::TcpStoreServer,
    Vec<Rendezvous>,
    chorus_store::TcpStore,
) {
    use chorus_store::{ClientOptions, ServerOptions, TcpStore, TcpStoreServer};
    let server = TcpStoreServer::bind("127.0.0.1:0".parse().unwrap(), ServerOptions::default())
        .await
        .unwrap();
    let port = server.local_addr().port();
    let ranks = join_world(world, port, |b| b.launcher_store()).await;
    let launcher = TcpStore::connect(&format!("127.0.0.1:{port}"), ClientOptions::default())
        .await
        .unwrap();
    (server, ranks, launcher)
}

/// The launcher's side of a multi-node job's end (chorus-run on node 0):
/// it waits, bounded, for every rank to leave its store; once it stopped
/// serving, a rank that leaves late does so without an error.
#[tokio::test]
async fn a_launchers_store_is_waited_on_and_a_late_goodbye_is_no_error() {
    use chorus_store::rendezvous::wait_until_all_left;
    let (server, ranks, launcher) = launcher_job(3).await;
    let mut ranks = ranks.into_iter();
    let (r0, r1, r2) = (
        ranks.next().unwrap(),
        ranks.next().unwrap(),
        ranks.next().unwrap(),
    );
    r0.shutdown().await.unwrap();
    r1.shutdown().await.unwrap();
    let e = wait_until_all_left(&launcher, 3, Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, RendezvousError::NeverLeft { missing, world_size: 3, .. } if missing == &[2]),
        "{e:?}"
    );
    server.shutdown().await;
    // Rank 2 leaves after the launcher stopped serving: a warning only.
    r2.shutdown().await.unwrap();

    // Everyone leaves in time: the wait ends at the last goodbye.
    let (server, ranks, launcher) = launcher_job(2).await;
    for r in ranks {
        r.shutdown().await.unwrap();
    }
    wait_until_all_left(&launcher, 2, Duration::from_secs(30))
        .await
        .unwrap();
    server.shutdown().await;
}
