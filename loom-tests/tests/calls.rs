//! Loom models of a pipelined connection's request table
//! (`chorus_core::calls`): the caller reading its own reply racing the
//! driver reading it, connection loss, a dropped request future, and the
//! driver's timer racing a new request's registration.
#![forbid(unsafe_code)]
#![cfg(loom)]

use std::task::Poll;
use std::time::{Duration, Instant};

use chorus_core::calls::Calls;
use chorus_loom_tests::{model, poll_once};
use loom::future::block_on;
use loom::sync::Arc;
use loom::thread;

type Table = Calls<u32, &'static str>;

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(60)
}

/// Awaits request `id` the way the store client's future does.
fn await_reply(calls: &Table, id: u64) -> Option<Result<u32, &'static str>> {
    block_on(std::future::poll_fn(|cx| calls.poll(id, cx)))
}

/// The caller's side and the driver both read the socket; each completes
/// the request with the reply it read (here, different stand-ins). The
/// awaiting future is always woken, gets exactly one of them, and the
/// table is empty afterwards.
#[test]
fn caller_and_driver_complete_the_same_request() {
    model(|| {
        let calls = Arc::new(Table::new());
        assert!(calls.register(1, deadline()).expect("live").alone);
        let readers: Vec<_> = [10, 20]
            .into_iter()
            .map(|v| {
                let calls = calls.clone();
                thread::spawn(move || calls.complete(1, Ok(v)))
            })
            .collect();
        let got = await_reply(&calls, 1).expect("registered");
        let won: Vec<bool> = readers
            .into_iter()
            .map(|t| t.join().expect("reader"))
            .collect();
        assert_eq!(
            won.iter().filter(|w| **w).count(),
            1,
            "exactly one result lands"
        );
        let expect = if won[0] { 10 } else { 20 };
        assert_eq!(got, Ok(expect));
        assert!(calls.is_empty());
    });
}

/// A reply racing the connection's end: the future is woken with one of
/// them, a request registered after the end is refused, nothing leaks.
#[test]
fn reply_races_connection_loss() {
    model(|| {
        let calls = Arc::new(Table::new());
        calls.register(1, deadline()).expect("live");
        let reader = {
            let calls = calls.clone();
            thread::spawn(move || calls.complete(1, Ok(7)))
        };
        let driver = {
            let calls = calls.clone();
            thread::spawn(move || calls.end("server closed the connection"))
        };
        let got = await_reply(&calls, 1).expect("registered");
        let replied = reader.join().expect("reader");
        driver.join().expect("driver");
        if replied {
            assert_eq!(got, Ok(7));
        } else {
            assert_eq!(got, Err("server closed the connection"));
        }
        assert_eq!(
            calls.register(2, deadline()),
            Err("server closed the connection")
        );
        assert!(calls.is_empty());
    });
}

/// The request's future is polled once and dropped while its reply
/// arrives: the entry is gone either way, and a late reply is ignored.
#[test]
fn dropped_future_races_its_reply() {
    model(|| {
        let calls = Arc::new(Table::new());
        calls.register(1, deadline()).expect("live");
        let reader = {
            let calls = calls.clone();
            thread::spawn(move || calls.complete(1, Ok(3)))
        };
        let mut fut = Box::pin(std::future::poll_fn(|cx| calls.poll(1, cx)));
        let first = poll_once(&mut fut);
        drop(fut);
        if !matches!(first, Poll::Ready(_)) {
            calls.cancel(1);
        }
        reader.join().expect("reader");
        assert!(calls.is_empty(), "no entry outlives its future");
        assert!(
            !calls.complete(1, Ok(4)),
            "a reply after the drop is ignored"
        );
    });
}

/// The driver arms its timer while a caller registers a request: either
/// the timer is no later than the request's deadline, or the caller is
/// told to wake the driver. An overdue request fails and its future is
/// woken.
#[test]
fn timer_arming_races_registration() {
    model(|| {
        let base = Instant::now();
        let lead = Duration::from_secs(10);
        let calls = Arc::new(Table::new());
        // One request already overdue when the driver looks.
        calls.register(1, base).expect("live");
        let driver = {
            let calls = calls.clone();
            thread::spawn(move || calls.expire(base + Duration::from_millis(1), lead, || "overdue"))
        };
        let waiter = {
            let calls = calls.clone();
            thread::spawn(move || await_reply(&calls, 1))
        };
        let late = base + lead;
        let reg = calls.register(2, late).expect("live");
        let armed = driver.join().expect("driver");
        assert!(
            reg.wake_driver || armed <= late,
            "the driver sleeps past a deadline without being told"
        );
        // The driver, woken if it was told to, re-arms in time.
        let armed = if reg.wake_driver {
            calls.expire(base + Duration::from_millis(2), lead, || "overdue")
        } else {
            armed
        };
        assert!(armed <= late);
        assert_eq!(waiter.join().expect("waiter"), Some(Err("overdue")));
        calls.cancel(2);
        assert!(calls.is_empty());
    });
}
