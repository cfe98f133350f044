use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::watchdog::ErrorPolicy;
use chorus_core::work::OpFuture;
use chorus_core::Registry;
use chorus_core::{OpContext, WorkError};
use chorus_store::InMemoryStore;
use chorus_store::{Store, StoreError};

/// Bound on every wait in these tests: reaching it is a failure, not a
/// measurement.
const BOUND: Duration = Duration::from_secs(20);

fn ctx(rank: usize, seq: u64, op: &'static str) -> OpContext {
    OpContext {
        rank,
        group: "g".into(),
        seq,
        op,
        internal: None,
    }
}

fn timeout_err(rank: usize) -> WorkError {
    WorkError::OpTimeout {
        ctx: ctx(rank, 3, "all_reduce"),
        after: Duration::from_millis(500),
    }
}

fn rank(
    store: &Arc<dyn Store>,
    epoch: u64,
    r: usize,
    policy: ErrorPolicy,
) -> (Arc<Registry>, ErrorPropagation) {
    let reg = Arc::new(Registry::new());
    let p = ErrorPropagation::start(store.clone(), epoch, &reg, "g".into(), r, 2, policy);
    (reg, p)
}

fn published(store: &Arc<dyn Store>, epoch: u64) -> RemoteFailure {
    let s = store.clone();
    let v = chorus_store::rt::handle()
        .expect("runtime")
        .block_on(async move { s.get(&key(epoch), BOUND).await })
        .expect("published failure");
    serde_json::from_slice(&v).expect("valid JSON")
}

#[test]
fn a_peer_failure_fails_pending_works_with_remote_naming_the_origin() {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let (r0, p0) = rank(&store, 0, 0, ErrorPolicy::AbortGroup);
    let (r1, _p1) = rank(&store, 0, 1, ErrorPolicy::AbortGroup);
    let (r2, _p2) = rank(&store, 0, 2, ErrorPolicy::FailWorks);
    let (w1, _c1) = OpFuture::<u32>::new(ctx(1, 3, "all_reduce"), &r1, None).expect("register");
    let (w2, _c2) = OpFuture::<u32>::new(ctx(2, 3, "all_reduce"), &r2, None).expect("register");

    r0.abort(&timeout_err(0));
    assert!(p0.flush(BOUND));

    for (r, w) in [(1, w1), (2, w2)] {
        let err = w.wait_timeout(BOUND).expect_err("the work must fail").error;
        let WorkError::Remote {
            ctx: c,
            origin,
            cause,
        } = &err
        else {
            panic!("rank {r}: expected Remote, got {err}");
        };
        assert_eq!(*origin, 0);
        assert_eq!(c.rank, r);
        assert_eq!(c.seq, 3, "re-addressed to the pending op");
        assert!(cause.contains("op timed out"), "{cause}");
        assert!(cause.contains("seq 3 (all_reduce)"), "{cause}");
        let msg = err.to_string();
        assert!(msg.contains("rank 0 of the group failed"), "{msg}");
        assert_eq!(err.kind(), "Remote");
    }
    // Both policies mark the group failed: later calls fail at once.
    for reg in [&r1, &r2] {
        assert_eq!(reg.errored().map(|e| e.kind()), Some("Remote"));
        let refused = OpFuture::<u32>::new(ctx(9, 4, "all_reduce"), reg, None);
        assert!(matches!(refused, Err(WorkError::GroupErrored { .. })));
    }
    // The origin's record, and not re-published by the peers.
    let f = published(&store, 0);
    assert_eq!(
        (f.origin_rank, f.seq, f.op.as_str(), f.kind.as_str()),
        (0, 3, "all_reduce", "OpTimeout")
    );
}

#[test]
fn the_first_failure_is_the_one_everyone_sees_and_nobody_applies_its_own() {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let (r0, p0) = rank(&store, 0, 0, ErrorPolicy::AbortGroup);
    let (r1, p1) = rank(&store, 0, 1, ErrorPolicy::AbortGroup);
    let lost = WorkError::PeerLost {
        ctx: ctx(1, 5, "broadcast"),
        peer: 2,
        cause: "closed".into(),
    };
    r1.abort(&lost);
    assert!(p1.flush(BOUND));
    wait_until(|| r0.errored().is_some());
    match r0.errored() {
        Some(WorkError::Remote { origin, cause, .. }) => {
            assert_eq!(origin, 1);
            assert!(cause.contains("lost connection to rank 2"), "{cause}");
        }
        other => panic!("expected Remote from rank 1, got {other:?}"),
    }
    // A later local error neither replaces the first nor the published one.
    r0.abort(&timeout_err(0));
    assert!(p0.flush(BOUND));
    let f = published(&store, 0);
    assert_eq!((f.origin_rank, f.seq, f.kind.as_str()), (1, 5, "PeerLost"));
    // Rank 1 keeps its own error: its watcher ignores its own record.
    assert!(p1.flush(BOUND));
    wait_until(|| !p1.watching());
    assert_eq!(r1.errored().map(|e| e.kind()), Some("PeerLost"));
}

#[test]
fn a_group_of_a_later_epoch_ignores_its_predecessors_failure() {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    // Epoch 0: rank 0 failed.
    let (old0, p_old0) = rank(&store, 0, 0, ErrorPolicy::AbortGroup);
    old0.abort(&timeout_err(0));
    assert!(p_old0.flush(BOUND));
    // Epoch 1 (same group name, re-created): rank 1 waits; only rank 2's
    // failure of epoch 1 may fail it.
    let (r1, _p1) = rank(&store, 1, 1, ErrorPolicy::AbortGroup);
    let (w1, _c1) = OpFuture::<u32>::new(ctx(1, 1, "barrier"), &r1, None).expect("register");
    let (r2, p2) = rank(&store, 1, 2, ErrorPolicy::AbortGroup);
    r2.abort(&WorkError::Aborted {
        ctx: ctx(2, 0, "abort"),
        reason: "user abort".into(),
    });
    assert!(p2.flush(BOUND));
    match w1.wait_timeout(BOUND).map_err(|f| f.error) {
        Err(WorkError::Remote { origin, cause, .. }) => {
            assert_eq!(origin, 2);
            assert!(cause.contains("user abort"), "{cause}");
        }
        other => panic!("expected Remote from rank 2, got {other:?}"),
    }
}

/// Whether a failure of epoch `epoch` was published in `store`.
fn is_published(store: &Arc<dyn Store>, epoch: u64) -> bool {
    let s = store.clone();
    chorus_store::rt::handle()
        .expect("runtime")
        .block_on(async move { s.check(&[&key(epoch)]).await })
        .expect("check")
}

#[test]
fn a_stopped_propagation_publishes_nothing_and_stops_watching() {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let (r0, p0) = rank(&store, 0, 0, ErrorPolicy::AbortGroup);
    p0.stop();
    r0.abort(&timeout_err(0));
    assert!(p0.flush(BOUND));
    let exists = is_published(&store, 0);
    assert!(!exists, "a stopped propagation must not publish");
    wait_until(|| !p0.watching());
}

#[test]
fn invalid_arguments_and_remote_errors_are_not_published() {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let (r0, p0) = rank(&store, 0, 0, ErrorPolicy::AbortGroup);
    r0.fail_all(&WorkError::Remote {
        ctx: ctx(0, 0, "propagation"),
        origin: 1,
        cause: "from elsewhere".into(),
    });
    assert!(p0.flush(BOUND));
    let exists = is_published(&store, 0);
    assert!(!exists);
}

fn wait_until(mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < BOUND,
            "condition not reached within {BOUND:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A store whose host is gone: every operation fails at once.
#[derive(Debug)]
struct GoneStore;

fn gone() -> StoreError {
    StoreError::Connection {
        addr: "127.0.0.1:1".into(),
        cause: "connection refused".into(),
    }
}

#[async_trait::async_trait]
impl Store for GoneStore {
    async fn set(&self, _: &str, _: &[u8]) -> Result<(), StoreError> {
        Err(gone())
    }
    async fn get(&self, _: &str, _: Duration) -> Result<Vec<u8>, StoreError> {
        Err(gone())
    }
    async fn add(&self, _: &str, _: i64) -> Result<i64, StoreError> {
        Err(gone())
    }
    async fn compare_set(&self, _: &str, _: &[u8], _: &[u8]) -> Result<Vec<u8>, StoreError> {
        Err(gone())
    }
    async fn wait(&self, _: &[&str], _: Duration) -> Result<(), StoreError> {
        Err(gone())
    }
    async fn check(&self, _: &[&str]) -> Result<bool, StoreError> {
        Err(gone())
    }
    async fn delete(&self, _: &str) -> Result<bool, StoreError> {
        Err(gone())
    }
    async fn num_keys(&self) -> Result<u64, StoreError> {
        Err(gone())
    }
    async fn multi_get(&self, _: &[&str], _: Duration) -> Result<Vec<Vec<u8>>, StoreError> {
        Err(gone())
    }
    async fn multi_set(&self, _: &[(&str, &[u8])]) -> Result<(), StoreError> {
        Err(gone())
    }
}

#[test]
fn a_store_that_is_gone_neither_hangs_the_publisher_nor_the_watcher() {
    let store: Arc<dyn Store> = Arc::new(GoneStore);
    let (r0, p0) = rank(&store, 0, 0, ErrorPolicy::AbortGroup);
    wait_until(|| !p0.watching());
    r0.abort(&timeout_err(0));
    assert!(p0.flush(BOUND));
    // The local failure still stands.
    assert_eq!(r0.errored().map(|e| e.kind()), Some("OpTimeout"));
    drop(p0);
}
