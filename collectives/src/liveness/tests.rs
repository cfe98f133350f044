use std::time::{Duration, Instant};

use super::beat::period;
use super::clock::{PeerClock, Verdict};
use super::marks::LEFT;

const T: Duration = Duration::from_secs(3);

fn ms(t0: Instant, ms: u64) -> Instant {
    t0 + Duration::from_millis(ms)
}

#[test]
fn the_period_is_a_tenth_of_the_timeout_within_bounds() {
    assert_eq!(period(Duration::from_secs(3)), Duration::from_millis(300));
    assert_eq!(period(Duration::from_secs(60)), Duration::from_secs(1));
    assert_eq!(
        period(Duration::from_millis(100)),
        Duration::from_millis(50)
    );
}

#[test]
fn peers_that_beat_stay_alive_however_long() {
    let t0 = Instant::now();
    let mut c = PeerClock::new(1, 3, T, t0);
    assert_eq!(c.peers().collect::<Vec<_>>(), vec![0, 2]);
    for i in 0..100u64 {
        let v = i as i64 + 1;
        c.read(&[Some(v), Some(v * 2)], ms(t0, i * 300));
        assert_eq!(c.verdict(ms(t0, i * 300)), Verdict::Alive, "round {i}");
    }
}

#[test]
fn a_peer_whose_counter_stops_is_silent_after_the_timeout_and_named() {
    let t0 = Instant::now();
    let mut c = PeerClock::new(0, 3, T, t0);
    // Rank 2 beats; rank 1 stops after its first value.
    for i in 0..=10u64 {
        c.read(&[Some(1), Some(i as i64)], ms(t0, i * 300));
    }
    // Last change of rank 1 seen at t0 + 0 ms.
    assert_eq!(c.verdict(ms(t0, 2_999)), Verdict::Alive);
    match c.verdict(ms(t0, 3_000)) {
        Verdict::PeerSilent { peer, silent_for } => {
            assert_eq!(peer, 1);
            assert_eq!(silent_for, Duration::from_secs(3));
        }
        v => panic!("expected rank 1 silent, got {v:?}"),
    }
    // It beats again: alive.
    c.read(&[Some(2), Some(11)], ms(t0, 3_100));
    assert_eq!(c.verdict(ms(t0, 3_100)), Verdict::Alive);
}

#[test]
fn the_longest_silent_peer_is_named() {
    let t0 = Instant::now();
    let mut c = PeerClock::new(2, 4, T, t0);
    c.read(&[Some(1), Some(1), Some(1)], t0);
    c.read(&[Some(1), Some(2), Some(2)], ms(t0, 1_000));
    c.read(&[Some(1), Some(2), Some(3)], ms(t0, 2_000));
    assert_eq!(
        c.verdict(ms(t0, 4_500)),
        Verdict::PeerSilent {
            peer: 0,
            silent_for: Duration::from_millis(4_500)
        }
    );
}

#[test]
fn unreadable_values_do_not_count_as_beats() {
    let t0 = Instant::now();
    let mut c = PeerClock::new(0, 2, T, t0);
    c.read(&[Some(5)], t0);
    for i in 1..=20u64 {
        c.read(&[None], ms(t0, i * 200));
    }
    assert!(matches!(
        c.verdict(ms(t0, 4_000)),
        Verdict::PeerSilent { peer: 1, .. }
    ));
}

#[test]
fn a_silent_store_is_reported_before_any_peer() {
    let t0 = Instant::now();
    let mut c = PeerClock::new(0, 3, T, t0);
    c.read(&[Some(1), Some(1)], t0);
    c.store_failed("connection refused".into());
    assert_eq!(c.verdict(ms(t0, 2_000)), Verdict::Alive);
    match c.verdict(ms(t0, 3_500)) {
        Verdict::StoreSilent { silent_for, cause } => {
            assert_eq!(silent_for, Duration::from_millis(3_500));
            assert_eq!(cause, "connection refused");
        }
        v => panic!("expected the store silent, got {v:?}"),
    }
    // The store answers again, the peers moved: alive.
    c.read(&[Some(2), Some(2)], ms(t0, 3_600));
    assert_eq!(c.verdict(ms(t0, 3_600)), Verdict::Alive);
}

#[test]
fn a_group_of_one_is_always_alive() {
    let t0 = Instant::now();
    let mut c = PeerClock::new(0, 1, T, t0);
    assert_eq!(c.peers().count(), 0);
    c.read(&[], ms(t0, 10_000));
    assert_eq!(c.verdict(ms(t0, 10_000)), Verdict::Alive);
}

#[test]
fn a_peer_that_left_is_never_silent() {
    let t0 = Instant::now();
    let mut c = PeerClock::new(0, 3, T, t0);
    c.read(&[Some(3), Some(3)], t0);
    // Rank 1 left cleanly; rank 2 goes on beating.
    for i in 1..=20u64 {
        c.read(&[Some(3 + LEFT), Some(3 + i as i64)], ms(t0, i * 300));
    }
    assert_eq!(c.verdict(ms(t0, 6_000)), Verdict::Alive);
}

/// The liveness task of rank 0 of a group of 4 on `store`, with one
/// pending work, and peers 2 and 3 beating every period from a task of
/// their own (peer 1 beat once and stopped, as a process killed).
mod task {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use chorus_core::work::OpFuture;
    use chorus_core::{OpContext, Registry, WorkError};
    use chorus_store::{InMemoryStore, Store};

    use super::super::beat::{key, period};
    use super::super::marks::LOST;
    use super::super::{Liveness, PeerWitness, Report};
    use crate::watchdog::ErrorPolicy;

    const TIMEOUT: Duration = Duration::from_millis(1_500);
    const BOUND: Duration = Duration::from_secs(20);

    struct Setup {
        store: Arc<dyn Store>,
        reg: Arc<Registry>,
        witness: Arc<PeerWitness>,
        work: OpFuture<u32>,
        beating: Arc<AtomicBool>,
        _task: super::super::LivenessTask,
    }

    fn start(beaters: &'static [usize]) -> Setup {
        let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        let reg = Arc::new(Registry::new());
        let witness = Arc::new(PeerWitness::new(TIMEOUT));
        let l = Liveness {
            store: store.clone(),
            epoch: 0,
            group: "g".into(),
            rank: 0,
            size: 4,
            timeout: TIMEOUT,
            policy: ErrorPolicy::AbortGroup,
            witness: witness.clone(),
        };
        let h = chorus_store::rt::handle().expect("chorus's runtime");
        h.block_on(l.first_beat()).expect("first beat");
        for p in 1..4 {
            h.block_on(store.add(&key(0, p), 1))
                .expect("a peer's first beat");
        }
        let beating = Arc::new(AtomicBool::new(true));
        let (s, on) = (store.clone(), beating.clone());
        h.spawn(async move {
            while on.load(Ordering::Acquire) {
                for &p in beaters {
                    let _ = s.add(&key(0, p), 1).await;
                }
                tokio::time::sleep(period(TIMEOUT)).await;
            }
        });
        let ctx = OpContext::new(0, "g".into(), 5, "all_reduce");
        let (work, completer) = OpFuture::<u32>::new(ctx, &reg, None).expect("register");
        std::mem::forget(completer);
        let task = l.start(&reg);
        Setup {
            store,
            reg,
            witness,
            work,
            beating,
            _task: task,
        }
    }

    fn counter(store: &Arc<dyn Store>, peer: usize) -> i64 {
        let s = store.clone();
        chorus_store::rt::handle()
            .expect("runtime")
            .block_on(async move { s.add(&key(0, peer), 0).await })
            .expect("counter")
    }

    #[test]
    fn a_failure_the_backend_cannot_name_fails_the_group_naming_the_peer_that_stopped() {
        let s = start(&[2, 3]);
        std::thread::sleep(period(TIMEOUT) * 2);
        let t0 = Instant::now();
        assert_eq!(s.witness.report("ncclRemoteError", t0), Report::Hold);
        let err = s
            .work
            .wait_timeout(BOUND)
            .expect_err("the work must fail")
            .error;
        s.beating.store(false, Ordering::Release);
        match &err {
            WorkError::PeerLost { peer, cause, .. } => {
                assert_eq!(*peer, 1, "{err}");
                assert!(cause.contains("ncclRemoteError"), "{cause}");
                assert!(
                    cause.contains("rank 1's beat in the group's store stopped"),
                    "{cause}"
                );
            }
            e => panic!("expected PeerLost naming rank 1, got {e}"),
        }
        // (Named as lost, not silent: before the liveness timeout.)
        // The other ranks are told through the store.
        assert!(counter(&s.store, 1) >= LOST);
        assert!(counter(&s.store, 2) < LOST && counter(&s.store, 3) < LOST);
        assert_eq!(s.reg.errored().map(|e| e.kind()), Some("PeerLost"));
    }

    #[test]
    fn a_peer_another_rank_marked_lost_fails_the_pending_works_at_once() {
        let s = start(&[1, 2, 3]);
        std::thread::sleep(period(TIMEOUT) * 2);
        let st = s.store.clone();
        chorus_store::rt::handle()
            .expect("runtime")
            .block_on(async move { st.add(&key(0, 3), LOST).await })
            .expect("mark");
        let err = s
            .work
            .wait_timeout(BOUND)
            .expect_err("the work must fail")
            .error;
        s.beating.store(false, Ordering::Release);
        match &err {
            WorkError::PeerLost { peer, cause, .. } => {
                assert_eq!(*peer, 3, "{err}");
                assert!(
                    cause.contains("another rank of the group found rank 3 lost"),
                    "{cause}"
                );
            }
            e => panic!("expected PeerLost naming rank 3, got {e}"),
        }
    }

    #[test]
    fn when_every_peer_still_beats_the_backends_error_stands() {
        let s = start(&[1, 2, 3]);
        std::thread::sleep(period(TIMEOUT) * 2);
        let t0 = Instant::now();
        assert_eq!(s.witness.report("ncclSystemError", t0), Report::Hold);
        // The search clears the report once every peer moved.
        let deadline = Instant::now() + BOUND;
        while s.witness.report("ncclSystemError", Instant::now()) == Report::Hold {
            assert!(Instant::now() < deadline, "the search never ended");
            std::thread::sleep(Duration::from_millis(20));
        }
        s.beating.store(false, Ordering::Release);
        assert!(
            s.reg.errored().is_none(),
            "nobody is lost: the group stays up"
        );
        assert!(!s.work.is_done());
    }
}
