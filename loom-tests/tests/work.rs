//! Loom models of the work slot and the registry: complete vs poll vs drop
//! of a work, and abort racing submissions.
#![forbid(unsafe_code)]
#![cfg(loom)]

use std::sync::Arc as StdArc;

use chorus_core::{OpContext, OpFuture, Registry, WorkError};
use chorus_loom_tests::{model, poll_once, Tracked};
use loom::future::block_on;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

fn ctx(seq: u64) -> OpContext {
    OpContext {
        rank: 0,
        group: StdArc::from("g"),
        seq,
        op: "all_reduce",
        internal: None,
    }
}

fn abort_cause() -> WorkError {
    WorkError::Aborted {
        ctx: ctx(0),
        reason: "user abort".into(),
    }
}

/// What the caller does with its work while the backend completes it.
#[derive(Clone, Copy, Debug)]
enum Caller {
    /// Awaits it to the end (a lost wake-up would be a loom deadlock).
    Await,
    /// Drops it without polling.
    Drop,
    /// Polls it once, then drops it.
    PollThenDrop,
}

/// The backend completes a work while the caller awaits / drops / polls and
/// drops it, optionally with an abort racing both: the buffer is released
/// exactly once, never while in flight, and an awaiting caller is always
/// woken.
fn complete_vs_caller(caller: Caller, with_abort: bool) {
    model(move || {
        let reg = Arc::new(Registry::new());
        let drops = Arc::new(AtomicUsize::new(0));
        let in_flight = Arc::new(AtomicBool::new(true));
        let buf = Tracked::new(&drops, &in_flight);
        let (mut work, done) = OpFuture::<Tracked>::new(ctx(1), &reg, None).expect("registered");

        let backend = {
            let in_flight = in_flight.clone();
            thread::spawn(move || {
                // The op ends: the backend no longer touches the buffer.
                in_flight.store(false, Ordering::SeqCst);
                done.complete(Ok(buf));
            })
        };
        let aborter = with_abort.then(|| {
            let reg = reg.clone();
            thread::spawn(move || {
                reg.abort(&abort_cause());
            })
        });

        match caller {
            Caller::Await => match block_on(work).map_err(chorus_core::Failed::into_error) {
                Ok(b) => drop(b),
                Err(e) => {
                    assert!(with_abort, "only an abort fails it: {e}");
                    assert!(matches!(e, WorkError::Aborted { .. }), "{e}");
                }
            },
            Caller::Drop => drop(work),
            Caller::PollThenDrop => {
                let _ = poll_once(&mut work);
                drop(work);
            }
        }
        backend.join().expect("backend thread");
        if let Some(a) = aborter {
            a.join().expect("abort thread");
        }
        assert_eq!(drops.load(Ordering::SeqCst), 1, "released exactly once");
        assert_eq!(reg.pending(), 0, "no registry entry leaks");
    });
}

#[test]
fn complete_vs_await() {
    complete_vs_caller(Caller::Await, false);
}

#[test]
fn complete_vs_drop() {
    complete_vs_caller(Caller::Drop, false);
}

#[test]
fn complete_vs_poll_then_drop() {
    complete_vs_caller(Caller::PollThenDrop, false);
}

#[test]
fn complete_vs_await_vs_abort() {
    complete_vs_caller(Caller::Await, true);
}

#[test]
fn complete_vs_poll_then_drop_vs_abort() {
    complete_vs_caller(Caller::PollThenDrop, true);
}

/// abort races a submission (`OpFuture::new`) and the completion of an earlier
/// op: no waiter hangs, no entry leaks, the abort hook runs once, and the
/// group stays aborted.
#[test]
fn abort_races_submission() {
    model(|| {
        let reg = Arc::new(Registry::new());
        let hooks = Arc::new(AtomicUsize::new(0));
        {
            let hooks = hooks.clone();
            reg.set_abort_hook(move |_| {
                hooks.fetch_add(1, Ordering::SeqCst);
            });
        }
        let (w1, c1) = OpFuture::<u32>::new(ctx(1), &reg, None).expect("registered before abort");
        let submitter = {
            let reg = reg.clone();
            thread::spawn(move || match OpFuture::<u32>::new(ctx(2), &reg, None) {
                Ok((w2, c2)) => {
                    c2.complete(Ok(2));
                    match block_on(w2).map_err(chorus_core::Failed::into_error) {
                        Ok(v) => assert_eq!(v, 2),
                        Err(e) => assert!(matches!(e, WorkError::Aborted { .. }), "{e}"),
                    }
                }
                Err(e) => assert!(matches!(e, WorkError::GroupErrored { .. }), "{e}"),
            })
        };
        let aborter = {
            let reg = reg.clone();
            thread::spawn(move || {
                reg.abort(&abort_cause());
            })
        };
        c1.complete(Ok(1));
        match block_on(w1).map_err(chorus_core::Failed::into_error) {
            Ok(v) => assert_eq!(v, 1),
            Err(e) => assert!(matches!(e, WorkError::Aborted { .. }), "{e}"),
        }
        submitter.join().expect("submitter");
        aborter.join().expect("aborter");
        assert_eq!(reg.pending(), 0, "no entry leaks");
        assert_eq!(hooks.load(Ordering::SeqCst), 1, "the abort hook runs once");
        assert!(matches!(reg.errored(), Some(WorkError::Aborted { .. })));
        assert!(
            matches!(
                OpFuture::<u32>::new(ctx(3), &reg, None),
                Err(WorkError::GroupErrored { .. })
            ),
            "aborted stays aborted"
        );
    });
}

/// Two aborts race a pending work: the hook runs once, the waiter is failed
/// once and woken.
#[test]
fn concurrent_aborts_run_the_hook_once() {
    model(|| {
        let reg = Arc::new(Registry::new());
        let hooks = Arc::new(AtomicUsize::new(0));
        {
            let hooks = hooks.clone();
            reg.set_abort_hook(move |_| {
                hooks.fetch_add(1, Ordering::SeqCst);
            });
        }
        let (w, c) = OpFuture::<u32>::new(ctx(1), &reg, None).expect("registered");
        let aborters: Vec<_> = (0..2)
            .map(|_| {
                let reg = reg.clone();
                thread::spawn(move || reg.abort(&abort_cause()))
            })
            .collect();
        assert!(matches!(
            block_on(w).map_err(chorus_core::Failed::into_error),
            Err(WorkError::Aborted { .. })
        ));
        let failed: usize = aborters
            .into_iter()
            .map(|a| a.join().expect("aborter"))
            .sum();
        assert_eq!(failed, 1, "the pending work is failed once");
        assert_eq!(hooks.load(Ordering::SeqCst), 1, "the abort hook runs once");
        drop(c);
        assert_eq!(reg.pending(), 0);
    });
}

/// An abort and a `fail_all` race a pending work: the error hook runs once,
/// and has finished by the time the work's owner sees the error (error
/// propagation publishes from it; the owner may exit right after).
#[test]
fn the_error_hook_finishes_before_any_work_fails() {
    model(|| {
        let reg = Arc::new(Registry::new());
        let hooks = Arc::new(AtomicUsize::new(0));
        {
            let hooks = hooks.clone();
            reg.set_error_hook(move |_| {
                hooks.fetch_add(1, Ordering::SeqCst);
            });
        }
        let (w, c) = OpFuture::<u32>::new(ctx(1), &reg, None).expect("registered");
        let aborter = {
            let reg = reg.clone();
            thread::spawn(move || reg.abort(&abort_cause()))
        };
        let failer = {
            let reg = reg.clone();
            thread::spawn(move || reg.fail_all(&abort_cause()))
        };
        assert!(matches!(
            block_on(w).map_err(chorus_core::Failed::into_error),
            Err(WorkError::Aborted { .. })
        ));
        assert_eq!(
            hooks.load(Ordering::SeqCst),
            1,
            "the hook ran, once, before the work failed"
        );
        let failed = aborter.join().expect("aborter") + failer.join().expect("failer");
        assert_eq!(failed, 1, "the pending work is failed once");
        drop(c);
        assert_eq!(reg.pending(), 0);
    });
}

/// A holding work (the TCP backend's): an abort races the backend giving
/// the buffer back with its own failure, while the caller awaits or drops
/// the work. The buffer is released exactly once, never while in flight;
/// an awaiting caller is woken and gets the buffer back whichever came
/// first.
fn holding_fail_vs_abort(caller: Caller) {
    model(move || {
        let reg = Arc::new(Registry::new());
        let drops = Arc::new(AtomicUsize::new(0));
        let in_flight = Arc::new(AtomicBool::new(true));
        let buf = Tracked::new(&drops, &in_flight);
        let (mut work, done) =
            OpFuture::<Tracked>::new_holding(ctx(1), &reg, None, true, Default::default())
                .expect("registered");
        let backend = {
            let in_flight = in_flight.clone();
            thread::spawn(move || {
                in_flight.store(false, Ordering::SeqCst);
                done.fail(abort_cause(), buf);
            })
        };
        let aborter = {
            let reg = reg.clone();
            thread::spawn(move || {
                reg.abort(&abort_cause());
            })
        };
        match caller {
            Caller::Await => match block_on(work) {
                Ok(_) => panic!("the op failed"),
                Err(f) => {
                    assert!(f.buffers.is_some(), "the buffer comes back: {f}");
                    drop(f);
                }
            },
            Caller::Drop => drop(work),
            Caller::PollThenDrop => {
                let _ = poll_once(&mut work);
                drop(work);
            }
        }
        backend.join().expect("backend thread");
        aborter.join().expect("abort thread");
        assert_eq!(drops.load(Ordering::SeqCst), 1, "released exactly once");
        assert_eq!(reg.pending(), 0, "no registry entry leaks");
    });
}

#[test]
fn holding_fail_vs_abort_vs_await() {
    holding_fail_vs_abort(Caller::Await);
}

#[test]
fn holding_fail_vs_abort_vs_poll_then_drop() {
    holding_fail_vs_abort(Caller::PollThenDrop);
}

/// The two ops of a batch (one registry entry for both) complete on two
/// threads while an abort races them and the caller awaits both: each work
/// resolves (with its buffer, or the abort naming its own op), each buffer
/// is released exactly once, and the batch's one entry leaves the registry
/// whoever ends first.
#[test]
fn batch_members_complete_vs_abort() {
    model(|| {
        let reg = Arc::new(Registry::new());
        let drops = Arc::new(AtomicUsize::new(0));
        let pairs = chorus_core::WorkBatch::register(
            &reg,
            &ctx(1),
            2,
            std::time::Instant::now(),
            None,
            None,
            |b| {
                [1, 2].map(|s| {
                    b.add::<Tracked>(
                        ctx(s),
                        true,
                        chorus_core::flight_recorder::OpMeta::default(),
                    )
                })
            },
        )
        .expect("registered")
        .0;
        assert_eq!(reg.pending(), 2);
        let [(w1, c1), (w2, c2)] = pairs;
        let backends: Vec<_> = [c1, c2]
            .into_iter()
            .map(|c| {
                let in_flight = Arc::new(AtomicBool::new(true));
                let buf = Tracked::new(&drops, &in_flight);
                thread::spawn(move || {
                    // The op ends: the backend no longer touches the buffer.
                    in_flight.store(false, Ordering::SeqCst);
                    c.complete(Ok(buf));
                })
            })
            .collect();
        let aborter = {
            let reg = reg.clone();
            thread::spawn(move || {
                reg.abort(&abort_cause());
            })
        };
        for (seq, w) in [(1, w1), (2, w2)] {
            match block_on(w).map_err(chorus_core::Failed::into_error) {
                Ok(b) => drop(b),
                Err(e) => {
                    assert!(matches!(e, WorkError::Aborted { .. }), "{e}");
                    assert_eq!(e.context().seq, seq, "the abort names the op");
                }
            }
        }
        for b in backends {
            b.join().expect("backend thread");
        }
        aborter.join().expect("abort thread");
        assert_eq!(
            drops.load(Ordering::SeqCst),
            2,
            "each released exactly once"
        );
        assert_eq!(reg.pending(), 0, "the batch's entry leaves the registry");
    });
}

/// One work awaited through `n` waiters on threads of their own, as a batch's ops'
/// works share the batch's one work (`chorus_core::Fanout`'s protocol:
/// outcome and shared work behind one lock, the waiter registered before
/// of), while the backend completes it on another: every waiter resolves
/// with the outcome, none is left waiting.
fn fanout_waiters_vs_completion(n: usize) {
    use std::future::poll_fn;
    use std::task::Poll;

    struct Lead {
        work: Option<OpFuture<u32>>,
        outcome: Option<u32>,
    }

    model(move || {
        let reg = Arc::new(Registry::new());
        let (work, completer) = OpFuture::<u32>::new(ctx(1), &reg, None).expect("registered");
        let lead = Arc::new(loom::sync::Mutex::new(Lead {
            work: Some(work),
            outcome: None,
        }));
        let fanout = Arc::new(chorus_core::Fanout::new());
        let waiters: Vec<_> = (0..n)
            .map(|_| {
                let (lead, fanout) = (lead.clone(), fanout.clone());
                thread::spawn(move || {
                    block_on(poll_fn(|cx| {
                        let mut settled = false;
                        let r = {
                            let mut st = lead.lock().unwrap();
                            match st.outcome {
                                Some(v) => Poll::Ready(v),
                                None => {
                                    let w = st.work.as_mut().expect("work until its outcome");
                                    match fanout.poll(w, cx) {
                                        Poll::Ready(r) => {
                                            let v = r.expect("completed");
                                            st.outcome = Some(v);
                                            st.work = None;
                                            settled = true;
                                            Poll::Ready(v)
                                        }
                                        Poll::Pending => Poll::Pending,
                                    }
                                }
                            }
                        };
                        if settled {
                            fanout.wake_all_but(Some(cx.waker()));
                        }
                        r
                    }))
                })
            })
            .collect();
        completer.complete(Ok(7));
        for w in waiters {
            assert_eq!(w.join().expect("waiter"), 7);
        }
        assert_eq!(reg.pending(), 0);
    });
}

#[test]
fn fanout_one_waiter_vs_completion() {
    fanout_waiters_vs_completion(1);
}

#[test]
fn fanout_two_waiters_vs_completion() {
    fanout_waiters_vs_completion(2);
}
