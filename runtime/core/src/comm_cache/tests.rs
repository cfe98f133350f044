use super::*;

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Mutex as StdMutex;
use std::task::{Context, Poll};

use rand::{Rng, SeedableRng};

use crate::sync::{Arc, Ordering};

/// The communicator the fake factory makes.
#[derive(Debug)]
struct FakeComm {
    key: CommKey,
    store_key: String,
    serial: usize,
    dropped: std::sync::Arc<AtomicUsize>,
}

impl Drop for FakeComm {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("fake init of {0} failed")]
struct FakeError(String);

/// Counts drops of initialization futures (cancelled or finished).
#[derive(Debug)]
struct DropCount(std::sync::Arc<AtomicUsize>);
impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A factory whose initializations wait for a gate, record their store
/// keys, and fail while `fail_left` is positive.
#[derive(Default)]
struct Fake {
    calls: StdMutex<Vec<(CommKey, String)>>,
    fail_left: AtomicUsize,
    panic_next: AtomicBool,
    gate: Option<tokio::sync::watch::Receiver<bool>>,
    comm_drops: std::sync::Arc<AtomicUsize>,
    init_drops: std::sync::Arc<AtomicUsize>,
}

impl Fake {
    fn gated() -> (Self, tokio::sync::watch::Sender<bool>) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        (
            Fake {
                gate: Some(rx),
                ..Fake::default()
            },
            tx,
        )
    }

    fn store_keys(&self) -> Vec<String> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .map(|(_, s)| s.clone())
            .collect()
    }
}

type InitFut = Pin<Box<dyn Future<Output = Result<FakeComm, FakeError>> + Send>>;

impl CommFactory for Fake {
    type Comm = FakeComm;
    type Error = FakeError;
    type Init = InitFut;

    fn create(&self, key: &CommKey, store_key: String) -> InitFut {
        let serial = {
            let mut calls = self.calls.lock().unwrap();
            calls.push((key.clone(), store_key.clone()));
            calls.len()
        };
        let fail = self
            .fail_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let panic = self.panic_next.swap(false, Ordering::SeqCst);
        let gate = self.gate.clone();
        let key = key.clone();
        let comm_drops = self.comm_drops.clone();
        let guard = DropCount(self.init_drops.clone());
        Box::pin(async move {
            let _guard = guard;
            if let Some(mut gate) = gate {
                // The sender lives as long as the test.
                let _ = gate.wait_for(|open| *open).await;
            }
            if panic {
                panic!("fake factory panics on purpose");
            }
            if fail {
                return Err(FakeError(store_key));
            }
            Ok(FakeComm {
                key,
                store_key,
                serial,
                dropped: comm_drops,
            })
        })
    }
}

fn block_on<T>(f: impl Future<Output = T>) -> T {
    futures::executor::block_on(f)
}

/// Polls `f` once with a no-op waker.
fn poll_once<T: Unpin + Future>(f: &mut T) -> Poll<T::Output> {
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    Pin::new(f).poll(&mut cx)
}

#[test]
fn first_use_creates_later_uses_share() {
    let cache = CommCache::new("g", Fake::default());
    assert_eq!(
        (cache.created(), cache.cached(), cache.in_flight()),
        (0, 0, 0)
    );
    let a = block_on(cache.get(CommKey::devices([0, 1]))).unwrap();
    let b = block_on(cache.get(CommKey::devices([0, 1]))).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(a.key, CommKey::devices([0, 1]));
    assert_eq!(a.store_key, "comm/0");
    assert_eq!(
        (cache.created(), cache.cached(), cache.in_flight()),
        (1, 1, 0)
    );
}

#[test]
fn store_keys_follow_program_order_and_p2p_never_moves_the_counter() {
    let cache = CommCache::new("g", Fake::default());
    let d0 = CommKey::devices([0]);
    let d01 = CommKey::devices([0, 1]);
    block_on(cache.get(CommKey::pair(1, 0))).unwrap();
    assert_eq!(cache.collective_counter(), 0);
    block_on(cache.get(d01.clone())).unwrap();
    block_on(cache.get(CommKey::Pair { lo: 3, hi: 2 })).unwrap();
    block_on(cache.get(d0.clone())).unwrap();
    block_on(cache.get(d01.clone())).unwrap();
    block_on(cache.get(CommKey::pair(2, 3))).unwrap();
    assert_eq!(
        cache.factory().store_keys(),
        ["p2p/0:1", "comm/0", "p2p/2:3", "comm/1"]
    );
    assert_eq!(cache.collective_counter(), 2);
    assert_eq!(cache.created(), 4);
    // An unsorted hand-built pair is the same communicator as the sorted one.
    let a = block_on(cache.get(CommKey::Pair { lo: 1, hi: 0 })).unwrap();
    let b = block_on(cache.get(CommKey::pair(0, 1))).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(cache.created(), 4);
}

#[test]
fn key_display_is_the_store_key_form() {
    assert_eq!(CommKey::pair(7, 2).to_string(), "2:7");
    assert_eq!(CommKey::devices([3, 0, 1]).to_string(), "3,0,1");
    assert!(CommKey::pair(0, 1).is_p2p());
    assert!(!CommKey::devices([0]).is_p2p());
}

#[test]
fn two_caches_never_share() {
    let g1 = CommCache::new("g1", Fake::default());
    let g2 = CommCache::new("g2", Fake::default());
    let k = CommKey::devices([0]);
    let a = block_on(g1.get(k.clone())).unwrap();
    let b = block_on(g2.get(k)).unwrap();
    assert!(!Arc::ptr_eq(&a, &b));
    assert_eq!((g1.created(), g2.created()), (1, 1));
}

#[test]
fn failure_reaches_every_waiter_and_leaves_nothing_behind() {
    let (fake, gate) = Fake::gated();
    fake.fail_left.store(1, Ordering::SeqCst);
    let cache = CommCache::new("g", fake);
    let k = CommKey::devices([0, 1]);
    let mut waiters: Vec<_> = (0..4).map(|_| cache.get(k.clone())).collect();
    for w in &mut waiters {
        assert!(poll_once(w).is_pending());
    }
    assert_eq!((cache.created(), cache.in_flight()), (1, 1));
    gate.send_replace(true);
    let errs: Vec<_> = waiters
        .into_iter()
        .map(|w| block_on(w).unwrap_err())
        .collect();
    for e in &errs {
        match e {
            CommCacheError::Init {
                key,
                store_key,
                cause,
                ..
            } => {
                assert_eq!(key, &k);
                assert_eq!(store_key, "comm/0");
                assert_eq!(cause, &FakeError("comm/0".into()));
            }
            other => panic!("expected Init error, got {other:?}"),
        }
    }
    assert_eq!((cache.cached(), cache.in_flight()), (0, 0));
    // A later use retries cleanly, as a new collective initialization.
    let c = block_on(cache.get(k)).unwrap();
    assert_eq!(c.store_key, "comm/1");
    assert_eq!(
        (cache.created(), cache.cached(), cache.in_flight()),
        (2, 1, 0)
    );
    assert_eq!(cache.collective_counter(), 2);
}

#[test]
fn failed_p2p_retry_keeps_its_pair_key() {
    let fake = Fake::default();
    fake.fail_left.store(1, Ordering::SeqCst);
    let cache = CommCache::new("g", fake);
    assert!(block_on(cache.get(CommKey::pair(4, 1))).is_err());
    assert_eq!(
        block_on(cache.get(CommKey::pair(1, 4))).unwrap().store_key,
        "p2p/1:4"
    );
    assert_eq!(cache.factory().store_keys(), ["p2p/1:4", "p2p/1:4"]);
    assert_eq!(cache.collective_counter(), 0);
}

#[test]
fn abort_marks_cached_fails_waiters_and_later_inits() {
    let (fake, gate) = Fake::gated();
    let init_drops = fake.init_drops.clone();
    let comm_drops = fake.comm_drops.clone();
    let cache = CommCache::new("g", fake);
    let live = CommKey::devices([0]);
    let pending = CommKey::devices([1]);
    gate.send_replace(true);
    let comm = block_on(cache.get(live.clone())).unwrap();
    gate.send_replace(false);
    let mut w1 = cache.get(pending.clone());
    let mut w2 = cache.get(pending.clone());
    assert!(poll_once(&mut w1).is_pending());
    assert!(poll_once(&mut w2).is_pending());
    assert_eq!((cache.created(), cache.in_flight()), (2, 1));

    let marked = cache.abort("watchdog: rank 3 timed out");
    assert_eq!(marked.len(), 1);
    assert!(Arc::ptr_eq(&marked[0], &comm));
    assert!(
        cache.abort("again").is_empty(),
        "a second abort marks nothing new"
    );
    assert_eq!(&*cache.aborted().unwrap(), "watchdog: rank 3 timed out");
    // The parked initialization was dropped (cancelled), its waiters failed.
    assert_eq!(init_drops.load(Ordering::SeqCst), 2);
    for w in [w1, w2] {
        let e = block_on(w).unwrap_err();
        assert!(e.is_aborted(), "{e}");
        assert_eq!(e.key(), &pending);
    }
    assert_eq!((cache.cached(), cache.in_flight()), (1, 0));
    // The aborted communicator stays cached, marked aborted.
    let e = block_on(cache.get(live.clone())).unwrap_err();
    assert!(e.to_string().contains("watchdog: rank 3 timed out"), "{e}");
    // New keys fail at once; nothing is created any more.
    assert!(block_on(cache.get(CommKey::pair(0, 1)))
        .unwrap_err()
        .is_aborted());
    assert_eq!(cache.created(), 2);
    assert_eq!(cache.cached(), 1);
    drop((comm, marked));
    assert_eq!(
        comm_drops.load(Ordering::SeqCst),
        0,
        "the cache still holds it"
    );
    drop(cache);
    assert_eq!(comm_drops.load(Ordering::SeqCst), 1);
}

/// Abort lands while a waiter is polling the initialization (the factory
/// future aborts the cache itself): the communicator it then returns is not
/// cached, and is released.
#[test]
fn result_arriving_after_abort_is_not_cached() {
    type Hook = std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>;
    let hook: std::sync::Arc<Hook> = std::sync::Arc::default();
    let comm_drops = std::sync::Arc::new(AtomicUsize::new(0));
    let (h, d) = (hook.clone(), comm_drops.clone());
    let cache = std::sync::Arc::new(CommCache::new(
        "g",
        FnFactory(move |_: &CommKey, _: String| {
            let (h, d) = (h.clone(), d.clone());
            async move {
                if let Some(abort) = h.get() {
                    abort();
                }
                Ok::<_, FakeError>(DropCount(d))
            }
        }),
    ));
    let weak = std::sync::Arc::downgrade(&cache);
    assert!(hook
        .set(Box::new(move || {
            if let Some(c) = weak.upgrade() {
                c.abort("aborted mid-init");
            }
        }))
        .is_ok());
    let e = block_on(cache.get(CommKey::devices([0]))).unwrap_err();
    assert!(e.is_aborted(), "{e}");
    assert_eq!(
        (cache.cached(), cache.in_flight(), cache.created()),
        (0, 0, 1)
    );
    assert_eq!(
        comm_drops.load(Ordering::SeqCst),
        1,
        "the late communicator was released"
    );
    assert!(block_on(cache.get(CommKey::devices([0])))
        .unwrap_err()
        .is_aborted());
    assert_eq!(cache.created(), 1, "nobody re-initializes after abort");
}

#[test]
fn dropped_driver_hands_over_to_another_waiter() {
    let (fake, gate) = Fake::gated();
    let cache = CommCache::new("g", fake);
    let k = CommKey::devices([0, 1]);
    let mut driver = cache.get(k.clone());
    assert!(poll_once(&mut driver).is_pending());
    let mut other = cache.get(k.clone());
    assert!(poll_once(&mut other).is_pending());
    drop(driver);
    gate.send_replace(true);
    let c = block_on(other).unwrap();
    assert_eq!(c.store_key, "comm/0");
    assert_eq!(
        (cache.created(), cache.in_flight(), cache.cached()),
        (1, 0, 1)
    );
}

#[test]
fn abandoned_init_stays_parked_and_is_resumed_with_the_same_store_key() {
    let (fake, gate) = Fake::gated();
    let cache = CommCache::new("g", fake);
    let k = CommKey::devices([2]);
    let mut w = cache.get(k.clone());
    assert!(poll_once(&mut w).is_pending());
    drop(w);
    assert_eq!((cache.created(), cache.in_flight()), (1, 1));
    gate.send_replace(true);
    let c = block_on(cache.get(k)).unwrap();
    assert_eq!(c.store_key, "comm/0");
    assert_eq!(c.serial, 1);
    assert_eq!(
        (
            cache.created(),
            cache.in_flight(),
            cache.collective_counter()
        ),
        (1, 0, 1)
    );
}

#[test]
fn panicking_factory_fails_waiters_and_a_retry_works() {
    let (fake, gate) = Fake::gated();
    fake.panic_next.store(true, Ordering::SeqCst);
    let cache = CommCache::new("g", fake);
    let k = CommKey::devices([0]);
    let mut w1 = cache.get(k.clone());
    let mut w2 = cache.get(k.clone());
    assert!(poll_once(&mut w1).is_pending());
    assert!(poll_once(&mut w2).is_pending());
    gate.send_replace(true);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| block_on(&mut w1)));
    assert!(panicked.is_err(), "the driver sees the factory's panic");
    assert!(matches!(
        block_on(w2),
        Err(CommCacheError::InitPanicked { .. })
    ));
    assert_eq!(cache.in_flight(), 0);
    drop(w1);
    let c = block_on(cache.get(k)).unwrap();
    assert_eq!(c.store_key, "comm/1");
}

#[test]
fn repolling_a_finished_future_looks_up_again() {
    let cache = CommCache::new("g", Fake::default());
    let mut w = cache.get(CommKey::devices([0]));
    let a = block_on(&mut w).unwrap();
    let b = block_on(&mut w).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert_eq!(cache.created(), 1);
}

#[test]
fn closure_factory() {
    let cache = CommCache::new(
        "g",
        FnFactory(|key: &CommKey, store_key: String| {
            let key = key.clone();
            async move { Ok::<_, FakeError>((key, store_key)) }
        }),
    );
    let c = block_on(cache.get(CommKey::pair(5, 1))).unwrap();
    assert_eq!(*c, (CommKey::pair(1, 5), "p2p/1:5".to_string()));
}

/// Many tokio tasks race on the first use of one key: one initialization,
/// one communicator for all.
#[test]
fn tokio_concurrent_first_uses_share_one_init() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    rt.block_on(async {
        let (fake, gate) = Fake::gated();
        let cache = std::sync::Arc::new(CommCache::new("g", fake));
        let started = std::sync::Arc::new(AtomicUsize::new(0));
        let k = CommKey::devices([0, 1, 2, 3]);
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let cache = cache.clone();
                let started = started.clone();
                let k = k.clone();
                tokio::spawn(async move {
                    started.fetch_add(1, Ordering::SeqCst);
                    cache.get(k).await
                })
            })
            .collect();
        while started.load(Ordering::SeqCst) < 16 {
            tokio::task::yield_now().await;
        }
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        gate.send_replace(true);
        let mut comms = Vec::new();
        for t in tasks {
            comms.push(t.await.unwrap().unwrap());
        }
        assert!(comms.iter().all(|c| Arc::ptr_eq(c, &comms[0])));
        assert_eq!(cache.created(), 1);
        assert_eq!((cache.cached(), cache.in_flight()), (1, 0));
        assert_eq!(cache.collective_counter(), 1);
    });
}

/// Random keys from many tokio tasks against a serial reference: one
/// creation per distinct key, every caller of a key gets the same
/// communicator, collective store keys are `comm/0..n` exactly once each, and
/// pair keys never move the counter.
#[test]
fn tokio_random_keys_against_reference() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6368_6f72_7573);
    for _round in 0..5 {
        let keys: Vec<CommKey> = (0..64)
            .map(|_| {
                if rng.gen_bool(0.4) {
                    CommKey::pair(rng.gen_range(0..4), rng.gen_range(0..4))
                } else {
                    let n = rng.gen_range(1..=3);
                    CommKey::devices((0..n).map(|_| rng.gen_range(0..3)))
                }
            })
            .collect();
        let distinct: BTreeSet<CommKey> = keys.iter().cloned().collect();
        let n_collective = distinct.iter().filter(|k| !k.is_p2p()).count();
        rt.block_on(async {
            let (fake, gate) = Fake::gated();
            let cache = std::sync::Arc::new(CommCache::new("g", fake));
            let tasks: Vec<_> = keys
                .iter()
                .cloned()
                .map(|k| {
                    let cache = cache.clone();
                    tokio::spawn(async move {
                        let c = cache.get(k.clone()).await.unwrap();
                        (k, c)
                    })
                })
                .collect();
            tokio::task::yield_now().await;
            gate.send_replace(true);
            let mut by_key: HashMap<CommKey, Arc<FakeComm>> = HashMap::new();
            for t in tasks {
                let (k, c) = t.await.unwrap();
                assert_eq!(c.key, k);
                let first = by_key.entry(k).or_insert_with(|| c.clone());
                assert!(Arc::ptr_eq(first, &c), "one communicator per key");
            }
            assert_eq!(cache.created() as usize, distinct.len());
            assert_eq!(cache.cached(), distinct.len());
            assert_eq!(cache.in_flight(), 0);
            assert_eq!(cache.collective_counter() as usize, n_collective);
            let mut comm_keys: Vec<String> = cache
                .factory()
                .store_keys()
                .into_iter()
                .filter(|s| s.starts_with("comm/"))
                .collect();
            comm_keys.sort();
            let mut expected: Vec<String> =
                (0..n_collective).map(|n| format!("comm/{n}")).collect();
            expected.sort();
            assert_eq!(comm_keys, expected);
            for (k, c) in &by_key {
                if let CommKey::Pair { lo, hi } = k {
                    assert_eq!(c.store_key, format!("p2p/{lo}:{hi}"));
                }
            }
        });
    }
}

/// Two "ranks" (caches) issuing the same ops in the same program order get
/// the same store key for each key.
#[test]
fn ranks_in_program_order_agree_on_store_keys() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let program: Vec<CommKey> = (0..40)
        .map(|_| {
            if rng.gen_bool(0.5) {
                CommKey::pair(0, 1)
            } else {
                CommKey::devices((0..rng.gen_range(1..=2)).map(|_| rng.gen_range(0..2)))
            }
        })
        .collect();
    let r0 = CommCache::new("g", Fake::default());
    let r1 = CommCache::new("g", Fake::default());
    for k in &program {
        let a = block_on(r0.get(k.clone())).unwrap();
        let b = block_on(r1.get(k.clone())).unwrap();
        assert_eq!(a.store_key, b.store_key);
    }
    assert_eq!(r0.factory().store_keys(), r1.factory().store_keys());
}
