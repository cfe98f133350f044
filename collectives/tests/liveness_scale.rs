//! Peer liveness at 64 simulated ranks (`chorus::test_util::SimRank`),
//! each with its own connection to one store server: a stopped rank fails
//! every other rank's pending work with `PeerSilent` naming it within the
//! liveness timeout and a second; a rank cut off from the store knows it
//! (`Store`) and the others find it silent; a rank that left is never
//! silent, and a death behind it is still found.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus::store::{ClientOptions, ServerOptions, Store, StoreError, TcpStore, TcpStoreServer};
use chorus::test_util::SimRank;
use chorus::WorkError;

const N: usize = 64;
const LIVENESS: Duration = Duration::from_millis(1_000);
/// How long every rank has to learn of a silent peer.
const WITHIN: Duration = Duration::from_millis(2_000);

/// A store that can be cut off: once cut, every operation hangs (as over
/// a partition) until the caller's own bound gives up.
#[derive(Debug)]
struct Cuttable {
    inner: TcpStore,
    cut: Arc<AtomicBool>,
}

impl Cuttable {
    async fn gate(&self) {
        if self.cut.load(Ordering::Acquire) {
            futures::future::pending::<()>().await;
        }
    }
}

#[async_trait::async_trait]
impl Store for Cuttable {
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.gate().await;
        self.inner.set(key, value).await
    }
    async fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        self.gate().await;
        self.inner.get(key, timeout).await
    }
    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.gate().await;
        self.inner.add(key, delta).await
    }
    async fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        self.gate().await;
        self.inner.compare_set(key, expected, desired).await
    }
    async fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        self.gate().await;
        self.inner.wait(keys, timeout).await
    }
    async fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        self.gate().await;
        self.inner.check(keys).await
    }
    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        self.gate().await;
        self.inner.delete(key).await
    }
    async fn num_keys(&self) -> Result<u64, StoreError> {
        self.gate().await;
        self.inner.num_keys().await
    }
    async fn multi_get(
        &self,
        keys: &[&str],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        self.gate().await;
        self.inner.multi_get(keys, timeout).await
    }
    async fn multi_set(&self, entries: &[(&str, &[u8])]) -> Result<(), StoreError> {
        self.gate().await;
        self.inner.multi_set(entries).await
    }
}

struct Group {
    _server: TcpStoreServer,
    ranks: Vec<Option<SimRank>>,
    cuts: Vec<Arc<AtomicBool>>,
}

/// `N` ranks of a group named `name`, each on its own connection.
fn form(name: &'static str) -> Group {
    let h = chorus_store::rt::handle().expect("chorus's runtime");
    h.block_on(async move {
        let server = TcpStoreServer::bind("127.0.0.1:0".parse().unwrap(), ServerOptions::default())
            .await
            .expect("store server");
        let addr = server.local_addr().to_string();
        let mut joins = Vec::new();
        let mut cuts = Vec::new();
        for r in 0..N {
            let cut = Arc::new(AtomicBool::new(false));
            cuts.push(cut.clone());
            let addr = addr.clone();
            joins.push(tokio::spawn(async move {
                let inner = TcpStore::connect(&addr, ClientOptions::default())
                    .await
                    .expect("connect");
                let store: Arc<dyn Store> = Arc::new(Cuttable { inner, cut });
                SimRank::join(store, name, 0, r, N, LIVENESS)
                    .await
                    .expect("join")
            }));
        }
        let mut ranks = Vec::new();
        for j in joins {
            ranks.push(Some(j.await.expect("task")));
        }
        Group {
            _server: server,
            ranks,
            cuts,
        }
    })
}

impl Group {
    /// Waits until every rank but `except` failed, at most `bound`; the
    /// failures by rank.
    fn failures(&self, except: &[usize], bound: Duration) -> Vec<(usize, WorkError)> {
        let t0 = Instant::now();
        loop {
            let failed: Vec<(usize, WorkError)> = self
                .ranks
                .iter()
                .enumerate()
                .filter(|(r, _)| !except.contains(r))
                .filter_map(|(r, s)| Some((r, s.as_ref()?.failure()?)))
                .collect();
            if failed.len() == N - except.len() || t0.elapsed() >= bound {
                return failed;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn silent_peer(e: &WorkError) -> Option<usize> {
    match e {
        WorkError::PeerSilent { peer, .. } => Some(*peer),
        _ => None,
    }
}

#[test]
fn a_stopped_rank_fails_every_other_rank_within_the_timeout_and_a_second() {
    let mut g = form("silent");
    std::thread::sleep(LIVENESS / 2);
    let t0 = Instant::now();
    g.ranks[37].as_mut().unwrap().halt();
    let failed = g.failures(&[37], LIVENESS + WITHIN);
    let took = t0.elapsed();
    assert_eq!(failed.len(), N - 1, "only {} ranks failed", failed.len());
    for (r, e) in &failed {
        assert_eq!(silent_peer(e), Some(37), "rank {r}: {e}");
    }
    assert!(took >= LIVENESS, "found before the timeout: {took:?}");
    assert!(took <= LIVENESS + WITHIN, "{took:?}");
}

#[test]
fn a_rank_cut_off_from_the_store_knows_it_and_the_others_find_it_silent() {
    let g = form("cut");
    std::thread::sleep(LIVENESS / 2);
    g.cuts[5].store(true, Ordering::Release);
    let failed = g.failures(&[], LIVENESS * 2 + WITHIN);
    assert_eq!(failed.len(), N, "only {} ranks failed", failed.len());
    for (r, e) in &failed {
        if *r == 5 {
            assert_eq!(e.kind(), "Store", "the cut-off rank: {e}");
            assert!(e.to_string().contains("cut off"), "{e}");
        } else {
            assert_eq!(silent_peer(e), Some(5), "rank {r}: {e}");
        }
    }
}

#[test]
fn a_rank_that_left_is_never_silent_and_a_death_behind_it_is_found() {
    let mut g = form("left");
    std::thread::sleep(LIVENESS / 2);
    // Rank 20 leaves cleanly (its liveness stops as at shutdown).
    g.ranks[20] = None;
    let failed = g.failures(&[20], LIVENESS * 3);
    assert!(
        failed.is_empty(),
        "a rank that left is not silent: {failed:?}"
    );
    // Rank 19, which rank 20 watched, stops: rank 21 watches past 20.
    g.ranks[19].as_mut().unwrap().halt();
    let failed = g.failures(&[19, 20], LIVENESS + WITHIN);
    assert_eq!(failed.len(), N - 2, "only {} ranks failed", failed.len());
    for (r, e) in &failed {
        assert_eq!(silent_peer(e), Some(19), "rank {r}: {e}");
    }
}
