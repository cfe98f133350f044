//! Loom models of a relay (`chorus_core::relay`): a hosted future that a
//! caller polls in the host's stead while an event it waits for races the
//! caller's claim and release, two pollers never polling it at once, and a
//! cancel ending the host.
#![forbid(unsafe_code)]
#![cfg(loom)]

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use chorus_core::relay::{Relay, Step};
use chorus_loom_tests::model;
use loom::future::block_on;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

/// A one-shot event: the stand-in for a frame arriving on a socket.
#[derive(Default)]
struct Event {
    state: Mutex<(bool, Option<Waker>)>,
    /// Polls of the waiting future in progress (never above one).
    polling: AtomicUsize,
}

impl Event {
    fn fire(&self) {
        let w = {
            let mut st = self.state.lock().unwrap();
            st.0 = true;
            st.1.take()
        };
        if let Some(w) = w {
            w.wake();
        }
    }
}

/// Waits for the event, as a reader waits for its socket.
struct WaitFor(Arc<Event>);

impl Future for WaitFor {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let ev = &self.0;
        assert_eq!(
            ev.polling.fetch_add(1, Ordering::AcqRel),
            0,
            "two threads poll the hosted future at once"
        );
        let r = {
            let mut st = ev.state.lock().unwrap();
            if st.0 {
                Poll::Ready(())
            } else {
                st.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        };
        ev.polling.fetch_sub(1, Ordering::AcqRel);
        r
    }
}

/// An event, a relay of a future waiting for it, and the relay's host
/// running on a thread of its own.
fn hosted() -> (Arc<Event>, Arc<Relay>, thread::JoinHandle<()>) {
    let ev = Arc::new(Event::default());
    let relay = Arc::new(Relay::new(WaitFor(ev.clone())));
    let host = {
        let relay = relay.clone();
        thread::spawn(move || block_on(poll_fn(|cx| relay.poll_host(cx))))
    };
    (ev, relay, host)
}

/// The event fires while a caller claims the relay, polls it and lets go,
/// in any order: either someone's poll saw it, or the host is woken and
/// sees it. The host always ends (a lost wake-up would leave it parked:
/// loom reports the deadlock).
#[test]
fn an_event_during_a_claim_is_never_lost() {
    model(|| {
        let (ev, relay, h) = hosted();
        let fire = {
            let ev = ev.clone();
            thread::spawn(move || ev.fire())
        };
        if let Some(claim) = relay.claim() {
            claim.poll();
            claim.poll();
        }
        fire.join().unwrap();
        h.join().unwrap();
        assert!(relay.is_finished());
    });
}

/// Two callers and the host: only one caller gets the claim, and the
/// hosted future is never polled by two threads at once (the future
/// asserts it); the host ends once the event fired.
#[test]
fn one_claim_at_a_time_and_one_poll_at_a_time() {
    model(|| {
        let (ev, relay, h) = hosted();
        let claims = Arc::new(AtomicUsize::new(0));
        let other = {
            let (relay, claims) = (relay.clone(), claims.clone());
            thread::spawn(move || {
                if let Some(c) = relay.claim() {
                    claims.fetch_add(1, Ordering::AcqRel);
                    c.poll();
                    claims.fetch_sub(1, Ordering::AcqRel);
                }
            })
        };
        if let Some(c) = relay.claim() {
            assert_eq!(claims.fetch_add(1, Ordering::AcqRel), 0, "two claims");
            c.poll();
            claims.fetch_sub(1, Ordering::AcqRel);
        }
        ev.fire();
        other.join().unwrap();
        h.join().unwrap();
    });
}

/// A caller that finishes the future itself: the host ends too (it is
/// woken by the claim's release or finds the future gone), and a later
/// claim finds it finished.
#[test]
fn a_future_finished_by_a_caller_ends_the_host() {
    model(|| {
        let (ev, relay, h) = hosted();
        if let Some(claim) = relay.claim() {
            // Fired while claimed: the wake-up goes to the claim, and the
            // claim's poll serves it.
            ev.fire();
            let _ = claim.poll();
        } else {
            ev.fire();
        }
        h.join().unwrap();
        let c = relay.claim().expect("no other caller");
        assert_eq!(c.poll(), Step::Finished);
    });
}

/// A cancel, racing the host's poll, drops the future and ends the host
/// although the event never fires.
#[test]
fn cancel_ends_the_host() {
    model(|| {
        let (_never_fired, relay, h) = hosted();
        relay.cancel();
        h.join().unwrap();
        assert!(relay.is_finished());
    });
}
