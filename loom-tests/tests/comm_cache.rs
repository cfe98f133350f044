//! Loom models of the communicator cache and its in-initialization map.
#![forbid(unsafe_code)]
#![cfg(loom)]

use chorus_core::comm_cache::{CommCacheError, CommKey};
use chorus_loom_tests::{model, model_capped, poll_once, Fake, FakeCache};
use loom::future::block_on;
use loom::sync::atomic::Ordering;
use loom::sync::Arc;
use loom::thread;

fn key() -> CommKey {
    CommKey::devices([0, 1])
}

/// N concurrent first uses of one key: exactly one initialization, and every
/// caller gets the same communicator.
fn single_flight(callers: usize, yields: bool, max_preemptions: usize) {
    model_capped(max_preemptions, move || {
        let cache = Arc::new(FakeCache::new("g", Fake::new(0, yields)));
        let handles: Vec<_> = (1..callers)
            .map(|_| {
                let cache = cache.clone();
                thread::spawn(move || block_on(cache.get(key())).expect("init succeeds"))
            })
            .collect();
        let mine = block_on(cache.get(key())).expect("init succeeds");
        for h in handles {
            let theirs = h.join().expect("caller thread");
            assert!(
                Arc::ptr_eq(&mine, &theirs),
                "every caller gets the same communicator"
            );
        }
        assert_eq!(cache.created(), 1, "exactly one initialization");
        assert_eq!(cache.factory().store_keys(), ["comm/0"]);
        assert_eq!((cache.cached(), cache.in_flight()), (1, 0));
        assert_eq!(cache.collective_counter(), 1);
        drop(mine);
        let drops = cache.factory().comm_drops.clone();
        drop(cache);
        assert_eq!(
            drops.load(Ordering::SeqCst),
            1,
            "the communicator is released once"
        );
    });
}

#[test]
fn single_flight_two_callers() {
    single_flight(2, true, usize::MAX);
}

#[test]
fn single_flight_three_callers() {
    single_flight(3, true, usize::MAX);
}

/// Four callers: capped at 2 preemptions (about 30k interleavings, seconds;
/// 3 would take minutes).
#[test]
fn single_flight_four_callers() {
    single_flight(4, false, 2);
}

/// The initialization fails: every waiter gets that error, neither map keeps
/// the key, and a later use retries cleanly.
fn failed_init(callers: usize) {
    model(move || {
        let cache = Arc::new(FakeCache::new("g", Fake::new(1, true)));
        let handles: Vec<_> = (1..callers)
            .map(|_| {
                let cache = cache.clone();
                thread::spawn(move || block_on(cache.get(key())))
            })
            .collect();
        let mut results = vec![block_on(cache.get(key()))];
        results.extend(
            handles
                .into_iter()
                .map(|h| h.join().expect("caller thread")),
        );
        // Callers that shared the failed init get its error; a caller that
        // came after it failed retries (one shared second initialization).
        let (errs, oks): (Vec<_>, Vec<_>) = results.into_iter().partition(|r| r.is_err());
        for e in &errs {
            match e {
                Err(CommCacheError::Init {
                    store_key, cause, ..
                }) => {
                    assert_eq!(store_key, "comm/0");
                    assert_eq!(cause.0, "comm/0", "the error of the failed init");
                }
                other => panic!("expected the init error, got {other:?}"),
            }
        }
        assert!(!errs.is_empty(), "the first init fails");
        let oks: Vec<_> = oks.into_iter().map(|r| r.expect("ok")).collect();
        for c in &oks {
            assert!(Arc::ptr_eq(c, &oks[0]), "retriers share one init");
            assert_eq!(c.store_key, "comm/1");
        }
        let retried = usize::from(!oks.is_empty());
        assert_eq!(cache.created() as usize, 1 + retried);
        assert_eq!(
            cache.in_flight(),
            0,
            "the in-initialization map keeps nothing"
        );
        assert_eq!(cache.cached(), retried, "only a successful retry is cached");
        // A later use retries cleanly.
        let again = block_on(cache.get(key())).expect("retry succeeds");
        assert_eq!(
            again.store_key, "comm/1",
            "the retry is a new collective init"
        );
        assert_eq!((cache.cached(), cache.in_flight()), (1, 0));
        assert_eq!(cache.collective_counter(), 2);
    });
}

#[test]
fn failed_init_two_callers() {
    failed_init(2);
}

#[test]
fn failed_init_three_callers() {
    failed_init(3);
}

/// abort races an initialization: nobody hangs, no entry leaks, the
/// initialization's result is not cached live after the abort, and aborted
/// stays aborted.
#[test]
fn abort_races_init() {
    model(|| {
        let cache = Arc::new(FakeCache::new("g", Fake::new(0, true)));
        let c2 = cache.clone();
        let h = thread::spawn(move || block_on(c2.get(key())));
        let marked = cache.abort("user abort");
        let got = h.join().expect("caller thread");
        match &got {
            // The init finished before the abort: the abort marked it.
            Ok(comm) => {
                assert_eq!(marked.len(), 1);
                assert!(Arc::ptr_eq(comm, &marked[0]));
                assert_eq!(cache.cached(), 1, "an aborted comm stays cached");
            }
            Err(e) => {
                assert!(e.is_aborted(), "{e}");
                assert!(marked.is_empty());
                assert_eq!(cache.cached(), 0, "a result after abort is not cached");
            }
        }
        assert_eq!(cache.in_flight(), 0, "no entry leaks");
        assert!(cache.created() <= 1);
        // Aborted stays aborted: no silent re-initialization.
        let created = cache.created();
        assert!(block_on(cache.get(key()))
            .expect_err("aborted")
            .is_aborted());
        assert_eq!(cache.created(), created);
        assert!(cache.abort("again").is_empty());
        drop((got, marked));
        let drops = cache.factory().comm_drops.clone();
        drop(cache);
        assert_eq!(
            drops.load(Ordering::SeqCst) as u64,
            created,
            "every communicator released once"
        );
    });
}

/// abort races two waiters of one initialization.
#[test]
fn abort_races_two_waiters() {
    model(|| {
        let cache = Arc::new(FakeCache::new("g", Fake::new(0, true)));
        let (c1, c2) = (cache.clone(), cache.clone());
        let h1 = thread::spawn(move || block_on(c1.get(key())).map(|_| ()));
        let h2 = thread::spawn(move || block_on(c2.get(key())).map(|_| ()));
        cache.abort("watchdog");
        for h in [h1, h2] {
            if let Err(e) = h.join().expect("caller thread") {
                assert!(e.is_aborted(), "{e}");
            }
        }
        assert_eq!(cache.in_flight(), 0);
        assert!(cache.created() <= 1);
        assert!(block_on(cache.get(key()))
            .expect_err("aborted")
            .is_aborted());
    });
}

/// The waiter driving the initialization is dropped mid-way while others
/// wait or arrive: one of them takes over, nobody hangs, one
/// initialization.
fn dropped_driver(others: usize) {
    model(move || {
        let cache = Arc::new(FakeCache::new("g", Fake::new(0, true)));
        let c2 = cache.clone();
        let dropper = thread::spawn(move || {
            let mut get = c2.get(key());
            let first = poll_once(&mut get);
            drop(get);
            first.is_ready()
        });
        let waiters: Vec<_> = (1..others)
            .map(|_| {
                let cache = cache.clone();
                thread::spawn(move || block_on(cache.get(key())).expect("init succeeds"))
            })
            .collect();
        let mine = block_on(cache.get(key())).expect("init succeeds");
        let _ = dropper.join().expect("dropping thread");
        for w in waiters {
            assert!(Arc::ptr_eq(&mine, &w.join().expect("waiter")));
        }
        assert_eq!(mine.store_key, "comm/0");
        assert_eq!(cache.created(), 1);
        assert_eq!((cache.cached(), cache.in_flight()), (1, 0));
    });
}

#[test]
fn dropped_driver_hands_over() {
    dropped_driver(1);
}

#[test]
fn dropped_driver_hands_over_two_waiters() {
    dropped_driver(2);
}

/// P2P pair-keyed initializations never move the collective counter;
/// collective initializations move it exactly once each.
#[test]
fn p2p_never_moves_collective_counter() {
    model(|| {
        let cache = Arc::new(FakeCache::new("g", Fake::new(0, false)));
        let (c1, c2) = (cache.clone(), cache.clone());
        let h1 = thread::spawn(move || block_on(c1.get(CommKey::pair(1, 0))).expect("p2p"));
        let h2 = thread::spawn(move || block_on(c2.get(CommKey::devices([0]))).expect("d0"));
        let d1 = block_on(cache.get(CommKey::devices([1]))).expect("d1");
        let p = h1.join().expect("p2p thread");
        let d0 = h2.join().expect("d0 thread");
        assert_eq!(p.store_key, "p2p/0:1");
        let mut collective = [d0.store_key.clone(), d1.store_key.clone()];
        collective.sort();
        assert_eq!(collective, ["comm/0", "comm/1"]);
        assert_eq!(cache.collective_counter(), 2);
        assert_eq!(cache.created(), 3);
    });
}

/// The same, with two concurrent first uses of one collective key beside a
/// P2P one: the counter moves once.
#[test]
fn concurrent_collective_and_p2p_move_counter_once() {
    model(|| {
        let cache = Arc::new(FakeCache::new("g", Fake::new(0, false)));
        let (c1, c2) = (cache.clone(), cache.clone());
        let h1 = thread::spawn(move || block_on(c1.get(key())).expect("first"));
        let h2 = thread::spawn(move || block_on(c2.get(CommKey::pair(2, 3))).expect("p2p"));
        let a = block_on(cache.get(key())).expect("second");
        let b = h1.join().expect("first thread");
        let p = h2.join().expect("p2p thread");
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.store_key, "comm/0");
        assert_eq!(p.store_key, "p2p/2:3");
        assert_eq!(cache.collective_counter(), 1);
        assert_eq!(cache.created(), 2);
    });
}

/// The backend's wiring: the registry's abort hook aborts the cache. A
/// caller gets a communicator and submits an op on it while the group is
/// aborted: nobody hangs, nothing leaks, the group and the cache stay aborted.
#[test]
fn group_abort_races_init_and_submission() {
    use chorus_core::{OpContext, OpFuture, Registry, WorkError};
    model(|| {
        let cache = Arc::new(FakeCache::new("g", Fake::new(0, true)));
        let reg = Arc::new(Registry::new());
        {
            let cache = cache.clone();
            reg.set_abort_hook(move |cause| {
                cache.abort(cause);
            });
        }
        let op = |seq| OpContext {
            rank: 0,
            group: std::sync::Arc::from("g"),
            seq,
            op: "all_reduce",
            internal: None,
        };
        let (c2, r2) = (cache.clone(), reg.clone());
        let caller = thread::spawn(move || {
            let comm = match block_on(c2.get(key())) {
                Ok(comm) => comm,
                Err(e) => {
                    assert!(e.is_aborted(), "{e}");
                    return;
                }
            };
            match OpFuture::<u32>::new(op(1), &r2, None) {
                Ok((work, done)) => {
                    // The backend runs the op on `comm`, then completes it.
                    let _uses = &comm;
                    done.complete(Ok(7));
                    match block_on(work).map_err(chorus_core::Failed::into_error) {
                        Ok(v) => assert_eq!(v, 7),
                        Err(e) => assert!(matches!(e, WorkError::Aborted { .. }), "{e}"),
                    }
                }
                Err(e) => assert!(matches!(e, WorkError::GroupErrored { .. }), "{e}"),
            }
        });
        reg.abort(&WorkError::Aborted {
            ctx: op(0),
            reason: "user abort".into(),
        });
        caller.join().expect("caller thread");
        assert_eq!(reg.pending(), 0, "no registry entry leaks");
        assert_eq!(cache.in_flight(), 0, "no in-initialization entry leaks");
        assert!(cache.aborted().is_some(), "the hook aborted the cache");
        assert!(block_on(cache.get(key()))
            .expect_err("aborted")
            .is_aborted());
        assert!(OpFuture::<u32>::new(op(2), &reg, None).is_err());
        assert!(cache.created() <= 1);
    });
}
