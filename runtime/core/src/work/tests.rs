use super::*;
use crate::error::{Failed, OpContext, WorkError};
use crate::flight_recorder::OpMeta;
use crate::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn ctx(seq: u64) -> OpContext {
    OpContext {
        rank: 0,
        group: "test".into(),
        seq,
        op: "all_reduce",
        internal: None,
    }
}

/// A buffer that counts its drops, to check it is released exactly once.
struct Tracked(std::sync::Arc<AtomicUsize>);
impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn complete_then_await_yields_buffers() {
    let reg = Arc::new(Registry::new());
    let (work, done) = OpFuture::<Vec<u32>>::new(ctx(1), &reg, None).unwrap();
    assert_eq!(work.status(), WorkStatus::Pending);
    assert_eq!(reg.pending(), 1);
    done.complete(Ok(vec![1, 2, 3]));
    assert_eq!(work.status(), WorkStatus::Finished);
    assert_eq!(reg.pending(), 0);
    assert_eq!(futures::executor::block_on(work).unwrap(), vec![1, 2, 3]);
}

#[test]
fn await_then_complete_from_another_thread_wakes() {
    let reg = Arc::new(Registry::new());
    let (work, done) = OpFuture::<u64>::new(ctx(1), &reg, None).unwrap();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        done.complete(Ok(42));
    });
    assert_eq!(futures::executor::block_on(work).unwrap(), 42);
    t.join().unwrap();
}

#[test]
fn dropped_work_keeps_buffer_until_completion() {
    let drops = std::sync::Arc::new(AtomicUsize::new(0));
    let reg = Arc::new(Registry::new());
    let (work, done) = OpFuture::<Tracked>::new(ctx(1), &reg, None).unwrap();
    let buf = Tracked(drops.clone());
    drop(work);
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    done.complete(Ok(buf));
    assert_eq!(
        drops.load(Ordering::SeqCst),
        1,
        "released exactly once, at completion"
    );
}

#[test]
fn forgotten_work_keeps_buffer_until_completion() {
    let drops = std::sync::Arc::new(AtomicUsize::new(0));
    let reg = Arc::new(Registry::new());
    let (work, done) = OpFuture::<Tracked>::new(ctx(1), &reg, None).unwrap();
    std::mem::forget(work);
    let buf = Tracked(drops.clone());
    done.complete(Ok(buf));
    // The forgotten work leaks its Arc, so the slot (and buffer) stay alive:
    // no use-after-free is possible; the memory is leaked, not reused.
    assert_eq!(drops.load(Ordering::SeqCst), 0);
}

#[test]
fn abort_fails_pending_and_later_submissions() {
    let reg = Arc::new(Registry::new());
    let hook_calls = std::sync::Arc::new(AtomicUsize::new(0));
    let hc = hook_calls.clone();
    reg.set_abort_hook(move |_| {
        hc.fetch_add(1, Ordering::SeqCst);
    });
    let (w1, c1) = OpFuture::<u8>::new(ctx(1), &reg, None).unwrap();
    let (w2, _c2) = OpFuture::<u8>::new(ctx(2), &reg, None).unwrap();
    let cause = WorkError::Aborted {
        ctx: ctx(1),
        reason: "user abort".into(),
    };
    assert_eq!(reg.abort(&cause), 2);
    assert_eq!(reg.abort(&cause), 0);
    assert_eq!(hook_calls.load(Ordering::SeqCst), 1, "abort hook runs once");
    let e1 = futures::executor::block_on(w1).unwrap_err().into_error();
    let e2 = futures::executor::block_on(w2).unwrap_err().into_error();
    assert_eq!(e1.context().seq, 1);
    assert_eq!(
        e2.context().seq,
        2,
        "each work gets the cause under its own seq"
    );
    // The backend completing later is harmless.
    c1.complete(Ok(1));
    match OpFuture::<u8>::new(ctx(3), &reg, None) {
        Err(WorkError::GroupErrored { ctx, cause }) => {
            assert_eq!(ctx.seq, 3);
            assert!(matches!(*cause, WorkError::Aborted { .. }));
        }
        other => panic!("expected GroupErrored, got {other:?}"),
    }
}

#[test]
fn dropped_completer_fails_work_instead_of_hanging() {
    let reg = Arc::new(Registry::new());
    let (work, done) = OpFuture::<u8>::new(ctx(1), &reg, None).unwrap();
    drop(done);
    assert!(matches!(
        futures::executor::block_on(work).map_err(Failed::into_error),
        Err(WorkError::Backend { .. })
    ));
}

#[test]
fn blocking_wait_times_out_and_aborts() {
    let reg = Arc::new(Registry::new());
    let (w1, _c1) = OpFuture::<u8>::new(ctx(1), &reg, None).unwrap();
    let (w2, _c2) = OpFuture::<u8>::new(ctx(2), &reg, None).unwrap();
    let err = w1
        .wait_timeout(Duration::from_millis(30))
        .unwrap_err()
        .into_error();
    assert!(
        matches!(err, WorkError::OpTimeout { after, .. } if after == Duration::from_millis(30)),
        "the timeout given: {err}"
    );
    assert!(matches!(
        w2.wait_timeout(Duration::from_secs(5))
            .map_err(Failed::into_error),
        Err(WorkError::OpTimeout { .. })
    ));
    assert!(reg.errored().is_some());
}

#[test]
fn timing_out_a_completed_op_gives_its_outcome_and_aborts_nothing() {
    let reg = Arc::new(Registry::new());
    let (w, c) = OpFuture::<u8>::new(ctx(1), &reg, None).unwrap();
    c.complete(Ok(4));
    assert_eq!(w.time_out(Duration::from_millis(5)).unwrap(), 4);
    assert!(reg.errored().is_none());
    let (w, _c) = OpFuture::<u8>::new(ctx(2), &reg, None).unwrap();
    let err = w
        .time_out(Duration::from_millis(5))
        .unwrap_err()
        .into_error();
    assert!(
        matches!(err, WorkError::OpTimeout { after, .. } if after == Duration::from_millis(5)),
        "{err}"
    );
    assert!(reg.errored().is_some(), "timing out aborts the group");
}

#[test]
fn blocking_wait_returns_result() {
    let reg = Arc::new(Registry::new());
    let (w, c) = OpFuture::<u8>::new(ctx(1), &reg, None).unwrap();
    let t = std::thread::spawn(move || c.complete(Ok(7)));
    assert_eq!(w.wait_timeout(Duration::from_secs(10)).unwrap(), 7);
    t.join().unwrap();
}

#[test]
fn polled_after_completion_is_an_error_not_a_hang() {
    let reg = Arc::new(Registry::new());
    let (mut w, c) = OpFuture::<u8>::new(ctx(1), &reg, None).unwrap();
    c.complete(Ok(1));
    assert_eq!(w.try_take().unwrap().unwrap(), 1);
    assert_eq!(w.status(), WorkStatus::Consumed);
    assert!(futures::executor::block_on(&mut w).is_err());
}

#[test]
fn expired_lists_ops_past_deadline() {
    let reg = Arc::new(Registry::new());
    let now = Instant::now();
    let (_w1, _c1) = OpFuture::<u8>::new(ctx(1), &reg, Some(now)).unwrap();
    let (_w2, _c2) =
        OpFuture::<u8>::new(ctx(2), &reg, Some(now + Duration::from_secs(60))).unwrap();
    let exp = reg.expired(now + Duration::from_millis(1));
    assert_eq!(exp.len(), 1);
    assert_eq!(exp[0].1.seq, 1);
}

/// A probe that reports what the test sets.
struct Flag(std::sync::atomic::AtomicBool);
impl FinishedProbe for Flag {
    fn finished(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[test]
fn an_expired_op_its_probe_finds_finished_is_retired_not_reported() {
    use crate::flight_recorder::{FlightRecorder, OpState};
    let reg = Arc::new(Registry::with_recorder(Arc::new(FlightRecorder::new(16))));
    let states = || recorder_states(&reg);
    let now = Instant::now();
    let p1 = std::sync::Arc::new(Flag(false.into()));
    let p2 = std::sync::Arc::new(Flag(false.into()));
    let timeout = Some(Duration::ZERO);
    let (w1, c1) = OpFuture::<u8>::new_started(
        ctx(1),
        &reg,
        now,
        timeout,
        true,
        OpMeta::default(),
        Some(p1.clone()),
    )
    .unwrap();
    let (_w2, _c2) = OpFuture::<u8>::new_started(
        ctx(2),
        &reg,
        now,
        timeout,
        true,
        OpMeta::default(),
        Some(p2),
    )
    .unwrap();
    let later = now + Duration::from_millis(1);
    // Neither finished: both expired.
    assert_eq!(reg.expired(later).len(), 2);
    // Op 1 finished while nobody completed its work: retired, not reported.
    p1.0.store(true, Ordering::SeqCst);
    let exp = reg.expired(later);
    assert_eq!(exp.len(), 1);
    assert_eq!(exp[0].1.seq, 2);
    assert_eq!(reg.pending(), 1, "the finished op left the registry");
    assert!(reg.errored().is_none());
    assert_eq!(
        states(),
        vec![OpState::Completed, OpState::Started],
        "its flight record says it completed"
    );
    // Its work still completes normally, later.
    c1.complete(Ok(7));
    assert_eq!(futures::executor::block_on(w1).unwrap(), 7);
    assert_eq!(reg.pending(), 1);
}

#[test]
fn a_failed_op_aborts_the_group_once() {
    let reg = Arc::new(Registry::new());
    let hook_calls = std::sync::Arc::new(AtomicUsize::new(0));
    let hc = hook_calls.clone();
    reg.set_abort_hook(move |_| {
        hc.fetch_add(1, Ordering::SeqCst);
    });
    let (w1, c1) = OpFuture::<u8>::new(ctx(1), &reg, None).unwrap();
    let (w2, c2) = OpFuture::<u8>::new(ctx(2), &reg, None).unwrap();
    let cause = WorkError::PeerLost {
        ctx: ctx(1),
        peer: 3,
        cause: "connection reset".into(),
    };
    c1.complete(Err(cause));
    assert_eq!(hook_calls.load(Ordering::SeqCst), 1);
    let e2 = futures::executor::block_on(w2).unwrap_err().into_error();
    assert!(matches!(e2, WorkError::PeerLost { peer: 3, .. }), "{e2}");
    assert_eq!(e2.context().seq, 2);
    c2.complete(Err(WorkError::Aborted {
        ctx: ctx(2),
        reason: "x".into(),
    }));
    assert_eq!(hook_calls.load(Ordering::SeqCst), 1, "hook runs once");
    assert!(matches!(
        futures::executor::block_on(w1).map_err(Failed::into_error),
        Err(WorkError::PeerLost { .. })
    ));
    // An invalid argument does not abort.
    let reg2 = Arc::new(Registry::new());
    let (_w, c) = OpFuture::<u8>::new(ctx(1), &reg2, None).unwrap();
    c.complete(Err(WorkError::InvalidArgument {
        ctx: ctx(1),
        msg: "bad".into(),
    }));
    assert!(reg2.errored().is_none());
}

#[test]
fn ops_left_pending_among_many_finished_stay_found_and_the_ring_stays_bounded() {
    let reg = Arc::new(Registry::new());
    let now = Instant::now();
    let mut kept = Vec::new();
    let mut kept_works = Vec::new();
    for seq in 1..=5000u64 {
        let deadline = Some(now + Duration::from_secs(if seq % 2 == 0 { 0 } else { 60 }));
        let (w, c) = OpFuture::<u64>::new(ctx(seq), &reg, deadline).unwrap();
        // Every 700th op (and the first) is left pending: a work nobody
        // polls while many later ones finish.
        if seq == 1 || seq % 700 == 0 {
            kept.push((seq, c));
            kept_works.push(w);
        } else {
            c.complete(Ok(seq));
            assert_eq!(futures::executor::block_on(w).unwrap(), seq);
        }
        assert!(reg.ring_len() <= 1025, "ring of {} slots", reg.ring_len());
    }
    let seqs: Vec<u64> = kept.iter().map(|(s, _)| *s).collect();
    assert_eq!(reg.pending(), kept.len());
    let listed: Vec<u64> = reg.pending_ops().iter().map(|c| c.seq).collect();
    assert_eq!(listed, seqs, "pending ops in submission order");
    // The even ones among them are past their deadline.
    let expired: Vec<u64> = reg
        .expired(now + Duration::from_millis(1))
        .iter()
        .map(|(_, c, _)| c.seq)
        .collect();
    let even: Vec<u64> = seqs.iter().copied().filter(|s| s % 2 == 0).collect();
    assert_eq!(expired, even);
    // Completing a straggler (the first op) finds it.
    let (s0, c0) = kept.remove(0);
    c0.complete(Ok(s0));
    let w0 = kept_works.remove(0);
    assert_eq!(futures::executor::block_on(w0).unwrap(), s0);
    assert_eq!(reg.pending(), kept.len());
    // Failing the group reaches every one left, old or recent.
    let cause = WorkError::Backend {
        ctx: ctx(0),
        msg: "test".into(),
    };
    assert_eq!(reg.fail_all(&cause), kept.len());
    assert_eq!(reg.pending(), 0);
    for w in kept_works {
        assert!(futures::executor::block_on(w).is_err());
    }
    drop(kept);
}

#[test]
fn failed_op_gives_its_buffers_back() {
    let reg = Arc::new(Registry::new());
    let (work, done) = OpFuture::<Vec<u32>>::new(ctx(1), &reg, None).unwrap();
    let buf = vec![1, 2, 3];
    let ptr = buf.as_ptr();
    done.fail(
        WorkError::PeerLost {
            ctx: ctx(1),
            peer: 1,
            cause: "reset".into(),
        },
        buf,
    );
    let f = futures::executor::block_on(work).unwrap_err();
    assert!(
        matches!(f.error(), WorkError::PeerLost { peer: 1, .. }),
        "{f}"
    );
    let back = f.into_buffers().expect("the buffers come back");
    assert_eq!(back.as_ptr(), ptr, "the very buffer passed in");
    assert!(reg.errored().is_some(), "a failure still aborts the group");
}

#[test]
fn holding_work_failed_early_waits_for_its_buffers() {
    let reg = Arc::new(Registry::new());
    let (mut work, done) =
        OpFuture::<Vec<u32>>::new_holding(ctx(1), &reg, None, true, Default::default()).unwrap();
    let cause = WorkError::Aborted {
        ctx: ctx(0),
        reason: "user abort".into(),
    };
    assert_eq!(reg.abort(&cause), 1);
    assert_eq!(
        work.status(),
        WorkStatus::Pending,
        "no outcome without the buffers yet"
    );
    assert!(work.try_take().is_none());
    assert!(done.is_failed(), "the backend may skip the rest of the op");
    // The backend stops, and gives the buffers back with its own error.
    done.fail(
        WorkError::Backend {
            ctx: ctx(1),
            msg: "stopped".into(),
        },
        vec![7; 5],
    );
    assert_eq!(work.status(), WorkStatus::Failed);
    let f = futures::executor::block_on(work).unwrap_err();
    assert!(
        matches!(f.error(), WorkError::Aborted { .. }),
        "first cause wins: {f}"
    );
    assert_eq!(f.into_buffers(), Some(vec![7; 5]));
}

#[test]
fn holding_work_that_finished_after_the_abort_fails_with_its_buffers() {
    let reg = Arc::new(Registry::new());
    let (work, done) =
        OpFuture::<u8>::new_holding(ctx(1), &reg, None, true, Default::default()).unwrap();
    reg.fail_all(&WorkError::Aborted {
        ctx: ctx(0),
        reason: "x".into(),
    });
    done.complete(Ok(9));
    let f = futures::executor::block_on(work).unwrap_err();
    assert_eq!(f.into_buffers(), Some(9));
}

#[test]
fn holding_work_whose_backend_drops_it_fails_without_buffers() {
    let reg = Arc::new(Registry::new());
    let (work, done) =
        OpFuture::<u8>::new_holding(ctx(1), &reg, None, true, Default::default()).unwrap();
    reg.fail_all(&WorkError::Aborted {
        ctx: ctx(0),
        reason: "x".into(),
    });
    drop(done);
    let f = futures::executor::block_on(work).unwrap_err();
    assert!(matches!(f.error(), WorkError::Aborted { .. }));
    assert!(f.buffers.is_none());
}

#[test]
fn dropped_holding_work_releases_its_buffer_once_at_the_backends_failure() {
    let drops = std::sync::Arc::new(AtomicUsize::new(0));
    let reg = Arc::new(Registry::new());
    let (work, done) =
        OpFuture::<Tracked>::new_holding(ctx(1), &reg, None, true, Default::default()).unwrap();
    drop(work);
    reg.fail_all(&WorkError::Aborted {
        ctx: ctx(0),
        reason: "x".into(),
    });
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    done.fail(
        WorkError::Aborted {
            ctx: ctx(1),
            reason: "x".into(),
        },
        Tracked(drops.clone()),
    );
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn holding_blocking_wait_that_times_out_gets_the_buffers_after_the_abort() {
    let reg = Arc::new(Registry::new());
    let (work, done) =
        OpFuture::<Vec<u8>>::new_holding(ctx(1), &reg, None, true, Default::default()).unwrap();
    // The backend's abort hook stops the op; the backend then gives the
    // buffers back from its own thread.
    let done = std::sync::Mutex::new(Some(done));
    let (tx, rx) = std::sync::mpsc::channel::<Completer<Vec<u8>>>();
    let t = std::thread::spawn(move || {
        if let Ok(c) = rx.recv() {
            std::thread::sleep(Duration::from_millis(20));
            c.fail(
                WorkError::Aborted {
                    ctx: ctx(1),
                    reason: "stopped".into(),
                },
                vec![3; 4],
            );
        }
    });
    reg.set_abort_hook(move |_| {
        if let Some(c) = done.lock().unwrap().take() {
            let _ = tx.send(c);
        }
    });
    let f = work.wait_timeout(Duration::from_millis(20)).unwrap_err();
    assert!(matches!(f.error(), WorkError::OpTimeout { .. }), "{f}");
    assert_eq!(f.into_buffers(), Some(vec![3; 4]));
    t.join().unwrap();
}

/// `n` ops of one launch registered as a batch in `reg`, from seq `first`.
#[allow(clippy::type_complexity)]
fn batch_of(
    reg: &Arc<Registry>,
    first: u64,
    n: u64,
    timeout: Option<Duration>,
    probe: Option<std::sync::Arc<dyn FinishedProbe>>,
) -> Result<Vec<(OpFuture<u64>, Completer<u64>)>, WorkError> {
    WorkBatch::register(
        reg,
        &ctx(first),
        n as usize,
        Instant::now(),
        timeout,
        probe,
        |b| {
            (first..first + n)
                .map(|s| b.add::<u64>(ctx(s), true, OpMeta::default()))
                .collect()
        },
    )
    .map(|(works, _)| works)
}

fn recorder_states(reg: &Registry) -> Vec<crate::flight_recorder::OpState> {
    reg.recorder()
        .unwrap()
        .snapshot()
        .iter()
        .map(|r| r.state)
        .collect()
}

#[test]
fn a_batch_is_one_entry_for_all_its_ops_and_the_first_end_retires_it() {
    use crate::flight_recorder::{FlightRecorder, OpState};
    let reg = Arc::new(Registry::with_recorder(Arc::new(FlightRecorder::new(16))));
    let (_lone, lone_done) = OpFuture::<u64>::new(ctx(1), &reg, None).unwrap();
    let ops = batch_of(&reg, 2, 3, None, None).unwrap();
    assert_eq!(
        reg.ring_len(),
        2,
        "one entry for the lone op, one for the batch"
    );
    assert_eq!(reg.pending(), 4, "every op of the batch counts as pending");
    let seqs: Vec<u64> = reg.pending_ops().iter().map(|c| c.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3, 4]);
    assert_eq!(
        recorder_states(&reg),
        vec![
            OpState::Scheduled,
            OpState::Started,
            OpState::Started,
            OpState::Started
        ]
    );
    let mut ops = ops.into_iter();
    let (w2, c2) = ops.next().unwrap();
    c2.complete(Ok(20));
    // The batch's ops ended together: one completion retires them all.
    assert_eq!(reg.pending(), 1);
    assert_eq!(
        recorder_states(&reg),
        vec![
            OpState::Scheduled,
            OpState::Completed,
            OpState::Completed,
            OpState::Completed
        ]
    );
    assert_eq!(futures::executor::block_on(w2).unwrap(), 20);
    // The others still complete on their own, each with its own buffers.
    for (i, (w, c)) in ops.enumerate() {
        let v = 30 + i as u64;
        c.complete(Ok(v));
        assert_eq!(futures::executor::block_on(w).unwrap(), v);
    }
    lone_done.complete(Ok(1));
    assert_eq!(reg.pending(), 0);
    // Ids stay in order after the batch: a later op registers and retires.
    let (w, c) = OpFuture::<u64>::new(ctx(5), &reg, None).unwrap();
    c.complete(Ok(5));
    assert_eq!(futures::executor::block_on(w).unwrap(), 5);
    assert_eq!(reg.ring_len(), 0);
}

#[test]
fn an_aborted_batch_fails_each_of_its_works_as_its_own_op() {
    use crate::flight_recorder::{FlightRecorder, OpState};
    let reg = Arc::new(Registry::with_recorder(Arc::new(FlightRecorder::new(16))));
    let ops = batch_of(&reg, 1, 2, None, None).unwrap();
    let cause = WorkError::Aborted {
        ctx: ctx(0),
        reason: "test".into(),
    };
    assert_eq!(reg.abort(&cause), 2, "both ops of the batch were failed");
    assert_eq!(
        recorder_states(&reg),
        vec![OpState::Failed, OpState::Failed]
    );
    for (seq, (w, c)) in (1..).zip(ops) {
        let err = futures::executor::block_on(w).unwrap_err();
        assert_eq!(err.error.context().seq, seq, "the error names its own op");
        assert!(
            matches!(err.error, WorkError::Aborted { .. }),
            "{}",
            err.error
        );
        // The backend's completion afterwards is a no-op.
        c.complete(Ok(0));
    }
    assert_eq!(reg.pending(), 0);
    // A batch after the abort is refused, naming its first op.
    match batch_of(&reg, 7, 2, None, None) {
        Err(WorkError::GroupErrored { ctx, .. }) => assert_eq!(ctx.seq, 7),
        other => panic!("expected GroupErrored, got {:?}", other.map(|v| v.len())),
    }
}

#[test]
fn a_batch_past_its_deadline_times_out_as_one_or_is_retired_by_its_probe() {
    let reg = Arc::new(Registry::new());
    let probe = std::sync::Arc::new(Flag(false.into()));
    let p: std::sync::Arc<dyn FinishedProbe> = probe.clone();
    let ops = batch_of(&reg, 1, 2, Some(Duration::ZERO), Some(p)).unwrap();
    let later = Instant::now() + Duration::from_millis(1);
    let exp = reg.expired(later);
    assert_eq!(exp.len(), 1, "one entry, reported once");
    let (id, first, _) = exp[0].clone();
    assert_eq!(first.seq, 1);
    let err = WorkError::OpTimeout {
        ctx: first,
        after: Duration::ZERO,
    };
    assert!(reg.fail_one(id, err));
    for (seq, (w, _c)) in (1..).zip(ops) {
        let f = futures::executor::block_on(w).unwrap_err();
        assert!(matches!(f.error, WorkError::OpTimeout { .. }));
        assert_eq!(f.error.context().seq, seq);
    }
    // A finished batch past its deadline leaves quietly.
    let probe = std::sync::Arc::new(Flag(true.into()));
    let p: std::sync::Arc<dyn FinishedProbe> = probe.clone();
    let ops = batch_of(&reg, 3, 2, Some(Duration::ZERO), Some(p)).unwrap();
    assert!(reg
        .expired(Instant::now() + Duration::from_millis(1))
        .is_empty());
    assert_eq!(reg.pending(), 0);
    for (w, c) in ops {
        c.complete(Ok(9));
        assert_eq!(futures::executor::block_on(w).unwrap(), 9);
    }
}

#[test]
fn an_empty_batch_registers_nothing() {
    let reg = Arc::new(Registry::new());
    batch_of(&reg, 1, 0, None, None).unwrap();
    assert_eq!(reg.pending(), 0);
    let (w, c) = OpFuture::<u64>::new(ctx(1), &reg, None).unwrap();
    assert_eq!(reg.pending(), 1);
    c.complete(Ok(1));
    assert_eq!(futures::executor::block_on(w).unwrap(), 1);
}

#[test]
fn a_dropped_completer_of_a_batch_fails_only_its_own_work() {
    let reg = Arc::new(Registry::new());
    let mut ops = batch_of(&reg, 1, 2, None, None).unwrap().into_iter();
    let (w1, c1) = ops.next().unwrap();
    let (w2, c2) = ops.next().unwrap();
    drop(c1);
    let f = futures::executor::block_on(w1).unwrap_err();
    assert!(matches!(f.error, WorkError::Backend { .. }));
    c2.complete(Ok(2));
    assert_eq!(futures::executor::block_on(w2).unwrap(), 2);
    assert_eq!(reg.pending(), 0);
}

#[test]
fn a_batch_with_one_work_for_its_recorded_ops_counts_lists_and_retires_them_all() {
    use crate::flight_recorder::{FlightRecorder, OpState};
    let reg = Arc::new(Registry::with_recorder(Arc::new(FlightRecorder::new(16))));
    let lead = |reg: &Arc<Registry>, first: u64| {
        WorkBatch::register(reg, &ctx(first), 3, Instant::now(), None, None, |b| {
            let pair = b.add::<u64>(ctx(first), true, OpMeta::default());
            b.record(ctx(first + 1), true, OpMeta::default());
            b.record(ctx(first + 2), true, OpMeta::default());
            pair
        })
        .unwrap()
    };
    let ((w, c), ops) = lead(&reg, 1);
    let listed: Vec<u64> = ops.iter().map(|c| c.seq).collect();
    assert_eq!(
        listed,
        vec![1, 2, 3],
        "the batch's ops, in order, for whoever names them"
    );
    assert_eq!(reg.ring_len(), 1, "one entry for the three ops");
    assert_eq!(reg.pending(), 3, "each recorded op counts as pending");
    let seqs: Vec<u64> = reg.pending_ops().iter().map(|c| c.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3], "the ops without a work are listed too");
    assert_eq!(recorder_states(&reg), vec![OpState::Started; 3]);
    c.complete(Ok(7));
    assert_eq!(futures::executor::block_on(w).unwrap(), 7);
    assert_eq!(reg.pending(), 0);
    assert_eq!(recorder_states(&reg), vec![OpState::Completed; 3]);

    // Aborted, the one work fails as the batch's first op, and every
    // record is marked.
    let ((w, _c), _) = lead(&reg, 4);
    let cause = WorkError::Aborted {
        ctx: ctx(0),
        reason: "test".into(),
    };
    assert_eq!(reg.abort(&cause), 3, "the batch stood for three ops");
    let err = futures::executor::block_on(w).unwrap_err();
    assert_eq!(err.error().context().seq, 4);
    assert_eq!(
        recorder_states(&reg)[3..],
        [OpState::Failed, OpState::Failed, OpState::Failed]
    );
}

#[test]
fn the_deadline_hook_hears_every_deadline_entered_and_the_next_deadline_is_the_earliest_pending() {
    let reg = Arc::new(Registry::new());
    let heard = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let h = heard.clone();
    reg.set_deadline_hook(move |d| h.lock().unwrap().push(d));
    let now = Instant::now();
    let (late, early) = (now + Duration::from_secs(60), now + Duration::from_secs(5));
    let next = |reg: &Registry| reg.expired_and_next(now).1;
    assert_eq!(next(&reg), None);
    let (_w0, _c0) = OpFuture::<u8>::new(ctx(1), &reg, None).unwrap();
    let (_w1, c1) = OpFuture::<u8>::new(ctx(2), &reg, Some(late)).unwrap();
    assert_eq!(next(&reg), Some(late));
    let ((_w2, c2), _) = WorkBatch::register(
        &reg,
        &ctx(3),
        2,
        now,
        Some(Duration::from_secs(5)),
        None,
        |b| {
            let pair = b.add::<u8>(ctx(3), true, OpMeta::default());
            b.record(ctx(4), true, OpMeta::default());
            pair
        },
    )
    .unwrap();
    assert_eq!(
        *heard.lock().unwrap(),
        vec![late, early],
        "an op without a deadline is not heard; a batch is heard once"
    );
    assert_eq!(next(&reg), Some(early));
    c2.complete(Ok(1));
    assert_eq!(next(&reg), Some(late), "a finished op's deadline is gone");
    c1.complete(Ok(1));
    assert_eq!(next(&reg), None);
}
