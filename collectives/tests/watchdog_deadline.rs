//! The watchdog wakes at each op's deadline, however long its interval
//! between asynchronous-error checks: an op entered while it sleeps with
//! a deadline before its next round brings that round forward.
//!
//! The watchdog is a process-wide singleton configured once: this file is
//! its own test process with one test.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus::test_util::{watch, WatchedGroup};
use chorus::watchdog::{self, ErrorPolicy, WatchdogConfig};
use chorus_core::{OpContext, OpFuture, Registry, WorkError};

/// Far longer than the test: no check round comes while it runs.
const INTERVAL: Duration = Duration::from_secs(120);
/// Bound on every wait: reaching it is a failure, not a measurement.
const BOUND: Duration = Duration::from_secs(20);

fn ctx(seq: u64) -> OpContext {
    OpContext {
        rank: 0,
        group: "deadlines".into(),
        seq,
        op: "all_reduce",
        internal: None,
    }
}

/// Waits for `w` to fail and returns the error and when it failed.
fn failure(w: OpFuture<u8>) -> (WorkError, Instant) {
    let err = w.wait_timeout(BOUND).expect_err("must time out").error;
    (err, Instant::now())
}

/// The rounds the watchdog has ended since `base`, once they are at least
/// `least` or [`BOUND`] has passed.
fn rounds_since(base: u64, least: u64) -> u64 {
    let end = Instant::now() + BOUND;
    loop {
        let woke = watchdog::stats().rounds - base;
        if woke >= least || Instant::now() >= end {
            return woke;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn each_deadline_is_met_by_a_round_of_its_own_between_distant_checks() {
    let dir = std::env::temp_dir().join(format!("chorus-deadline-{}", std::process::id()));
    assert!(
        watchdog::configure(WatchdogConfig {
            interval: INTERVAL,
            heartbeat_timeout: Duration::from_secs(600),
            dump_dir: dir.clone(),
            dump_on_sigusr1: false,
            enabled: true,
        }),
        "the watchdog must not have started before this test"
    );
    let reg = Arc::new(Registry::new());
    let checks = Arc::new(AtomicUsize::new(0));
    let counted = checks.clone();
    watch(WatchedGroup {
        name: "deadlines".into(),
        rank: 0,
        size: 1,
        registry: Arc::downgrade(&reg),
        // Each timed-out op fails alone; the group stays usable.
        policy: ErrorPolicy::FailWorks,
        check: Some(Arc::new(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            None
        })),
    });
    let rounds = watchdog::stats().rounds;

    // One op, entered after the watchdog went to sleep for the interval.
    let t0 = Instant::now();
    let (w1, _c1) =
        OpFuture::<u8>::new(ctx(1), &reg, Some(t0 + Duration::from_millis(200))).unwrap();
    let (err, at) = failure(w1);
    assert!(matches!(err, WorkError::OpTimeout { .. }), "{err:?}");
    assert_eq!(err.context().seq, 1);
    assert!(at >= t0 + Duration::from_millis(200), "before its deadline");
    assert!(at < t0 + BOUND, "not woken by its deadline");

    // A later deadline entered first, then an earlier one: each is met in
    // its order, the earlier one without waiting for the later.
    let t1 = Instant::now();
    let (late, _cl) =
        OpFuture::<u8>::new(ctx(2), &reg, Some(t1 + Duration::from_millis(900))).unwrap();
    let (early, _ce) =
        OpFuture::<u8>::new(ctx(3), &reg, Some(t1 + Duration::from_millis(300))).unwrap();
    // An op with no deadline is never timed out; one that ends in time
    // neither.
    let (open, c_open) = OpFuture::<u8>::new(ctx(4), &reg, None).unwrap();
    let (timely, c_timely) =
        OpFuture::<u8>::new(ctx(5), &reg, Some(t1 + Duration::from_millis(400))).unwrap();
    c_timely.complete(Ok(5));
    let (err_early, at_early) = failure(early);
    let (err_late, at_late) = failure(late);
    assert_eq!((err_early.context().seq, err_late.context().seq), (3, 2));
    assert!(at_early >= t1 + Duration::from_millis(300));
    assert!(
        at_early < t1 + Duration::from_millis(900),
        "waited for the later deadline"
    );
    assert!(at_late >= t1 + Duration::from_millis(900));
    assert!(at_late < t1 + BOUND);
    assert_eq!(timely.wait_timeout(BOUND).expect("completed in time"), 5);
    c_open.complete(Ok(4));
    assert_eq!(open.wait_timeout(BOUND).expect("no deadline"), 4);

    let stats = watchdog::stats();
    assert_eq!(stats.timeouts, 3);
    assert!(reg.errored().is_none(), "FailWorks leaves the group alone");
    // A round per deadline (and the odd spare), no beat in between, and
    // no asynchronous-error check before the interval. A round is counted
    // once it has ended, after it failed its ops: the last one may still
    // be finishing here.
    let woke = rounds_since(rounds, 3);
    assert!((3..=12).contains(&woke), "{woke} rounds");
    assert_eq!(
        checks.load(Ordering::SeqCst),
        0,
        "checked before the interval"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
