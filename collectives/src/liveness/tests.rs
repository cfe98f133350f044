use std::time::{Duration, Instant};

use super::{period, PeerClock, Verdict, LEFT};

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
