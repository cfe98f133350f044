//! The requests of one pipelined connection that await their replies.
//!
//! A client connection (the store client's) has two sides that may read
//! replies: the caller, which reads the socket itself while its request
//! is the only one in flight (no thread hand-off on the way back), and the
//! connection's driver on chorus's I/O threads, which always watches the
//! socket and the clock, so that peer loss and overdue replies are caught
//! even while the caller's executor is blocked. [`Calls`] is what both
//! share: per request, its reply or error once known, the waker of the
//! future awaiting it, and its deadline; for the driver, when it must wake
//! next. Either side completes a request by its id; whoever polls the
//! request's future takes the result. No I/O happens here.
//!
//! # The driver's timer
//!
//! A request registered on an idle connection must not pay a wake-up of
//! the driver just to arm a timer. The driver therefore never sleeps past
//! `now + lead` (see [`Calls::expire`]), where `lead` is at most the
//! shortest time any request is given (the store client's
//! `request_timeout`): a request registered after the driver armed its
//! timer has a later deadline than that timer, and one registered before
//! is in the heap the driver looked at. [`Calls::register`] reports the
//! rare case where neither holds (a deadline earlier than the armed
//! timer), and the caller then wakes the driver.
//!
//! # Examples
//!
//! ```
//! use std::task::{Context, Poll};
//! use std::time::{Duration, Instant};
//! use chorus_core::calls::Calls;
//!
//! let calls: Calls<u32, String> = Calls::new();
//! let r = calls.register(7, Instant::now() + Duration::from_secs(60)).unwrap();
//! assert!(r.alone);
//! assert!(calls.complete(7, Ok(42)));
//! let waker = std::task::Waker::noop();
//! let mut cx = Context::from_waker(&waker);
//! assert_eq!(calls.poll(7, &mut cx), Poll::Ready(Some(Ok(42))));
//! assert!(calls.is_empty());
//! ```

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::sync::{lock, Mutex};

/// What [`Calls::register`] learned about the new request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
    /// No other request was awaiting its reply: the caller may read the
    /// reply itself.
    pub alone: bool,
    /// The request's deadline is earlier than the driver's timer: the
    /// caller must wake the driver so that it re-arms.
    pub wake_driver: bool,
}

struct Entry<R, E> {
    result: Option<Result<R, E>>,
    waker: Option<Waker>,
}

struct Inner<R, E> {
    entries: HashMap<u64, Entry<R, E>>,
    /// Deadlines by id; entries already answered stay until they reach the
    /// top (or the heap is rebuilt).
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    deadlines: HashMap<u64, Instant>,
    /// When the driver wakes next (`None`: not armed yet).
    armed: Option<Instant>,
    /// Why the connection ended, once it has.
    ended: Option<E>,
}

/// The table of a connection's requests awaiting replies (see the module
/// documentation).
pub struct Calls<R, E> {
    inner: Mutex<Inner<R, E>>,
}

impl<R, E> std::fmt::Debug for Calls<R, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = lock(&self.inner);
        f.debug_struct("Calls")
            .field("in_flight", &g.entries.len())
            .field("armed", &g.armed)
            .field("ended", &g.ended.is_some())
            .finish()
    }
}

impl<R, E: Clone> Default for Calls<R, E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<R, E: Clone> Calls<R, E> {
    /// An empty table of a live connection.
    pub fn new() -> Self {
        Calls {
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                timers: BinaryHeap::new(),
                deadlines: HashMap::new(),
                armed: None,
                ended: None,
            }),
        }
    }

    /// Registers request `id`, whose reply is overdue at `deadline`.
    ///
    /// # Errors
    ///
    /// The error that ended the connection, if it has ended.
    pub fn register(&self, id: u64, deadline: Instant) -> Result<Registration, E> {
        let mut g = lock(&self.inner);
        if let Some(e) = &g.ended {
            return Err(e.clone());
        }
        let alone = g.entries.is_empty();
        g.entries.insert(
            id,
            Entry {
                result: None,
                waker: None,
            },
        );
        g.deadlines.insert(id, deadline);
        g.timers.push(Reverse((deadline, id)));
        if g.timers.len() > 2 * g.entries.len() + 1024 {
            let live: BinaryHeap<_> = g.deadlines.iter().map(|(i, d)| Reverse((*d, *i))).collect();
            g.timers = live;
        }
        let wake_driver = g.armed.is_none_or(|a| deadline < a);
        if wake_driver {
            g.armed = Some(deadline);
        }
        Ok(Registration { alone, wake_driver })
    }

    /// Takes request `id`'s result if it is known, else leaves `cx`'s
    /// waker to be woken when it is. `Ready(None)`: no such request (never
    /// registered, or its result was already taken).
    pub fn poll(&self, id: u64, cx: &mut Context<'_>) -> Poll<Option<Result<R, E>>> {
        let mut g = lock(&self.inner);
        let Some(entry) = g.entries.get_mut(&id) else {
            return Poll::Ready(None);
        };
        match entry.result.take() {
            Some(r) => {
                g.entries.remove(&id);
                g.deadlines.remove(&id);
                Poll::Ready(Some(r))
            }
            None => {
                match &mut entry.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    slot => *slot = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }

    /// Gives request `id` its result and wakes its future. Returns false if
    /// no such request awaits one (its future was dropped, or it already
    /// has a result: the first one stays).
    pub fn complete(&self, id: u64, result: Result<R, E>) -> bool {
        let waker = {
            let mut g = lock(&self.inner);
            match g.entries.get_mut(&id) {
                Some(e) if e.result.is_none() => {
                    e.result = Some(result);
                    e.waker.take()
                }
                _ => return false,
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
        true
    }

    /// Forgets request `id` (its future was dropped); a reply that comes
    /// later is ignored.
    pub fn cancel(&self, id: u64) {
        let mut g = lock(&self.inner);
        g.entries.remove(&id);
        g.deadlines.remove(&id);
    }

    /// Fails every request whose deadline is not after `now` with
    /// `overdue()`, arms the driver's timer and returns it: the earliest
    /// deadline still pending, but never later than `now + lead` (see the
    /// module documentation for why `lead` must not exceed the shortest
    /// time a request is given).
    pub fn expire(&self, now: Instant, lead: Duration, overdue: impl Fn() -> E) -> Instant {
        let mut woken = Vec::new();
        let next = {
            let mut g = lock(&self.inner);
            let cap = now.checked_add(lead).unwrap_or(now);
            let next = loop {
                let Some(Reverse((d, id))) = g.timers.peek().copied() else {
                    break cap;
                };
                if g.deadlines.get(&id) != Some(&d) {
                    g.timers.pop();
                    continue;
                }
                if d > now {
                    break d.min(cap);
                }
                g.timers.pop();
                g.deadlines.remove(&id);
                if let Some(e) = g.entries.get_mut(&id) {
                    if e.result.is_none() {
                        e.result = Some(Err(overdue()));
                        woken.extend(e.waker.take());
                    }
                }
            };
            g.armed = Some(next);
            next
        };
        woken.into_iter().for_each(Waker::wake);
        next
    }

    /// Ends the connection with `e`: every request without a result fails
    /// with it, and so does every later [`register`](Self::register). The
    /// first end's error stays.
    pub fn end(&self, e: E) {
        let mut woken = Vec::new();
        {
            let mut g = lock(&self.inner);
            let e = g.ended.get_or_insert(e).clone();
            for entry in g.entries.values_mut() {
                if entry.result.is_none() {
                    entry.result = Some(Err(e.clone()));
                    woken.extend(entry.waker.take());
                }
            }
            g.timers.clear();
            g.deadlines.clear();
        }
        woken.into_iter().for_each(Waker::wake);
    }

    /// The error that ended the connection, if it has ended.
    pub fn ended(&self) -> Option<E> {
        lock(&self.inner).ended.clone()
    }

    /// Requests registered whose result has not been taken.
    pub fn len(&self) -> usize {
        lock(&self.inner).entries.len()
    }

    /// True if no request awaits its reply or the taking of its result.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn cx() -> Context<'static> {
        Context::from_waker(Waker::noop())
    }

    #[test]
    fn a_reply_wins_over_a_later_error_and_results_are_taken_once() {
        let calls: Calls<u32, &str> = Calls::new();
        let t = Instant::now() + Duration::from_secs(10);
        assert!(calls.register(1, t).unwrap().alone);
        assert!(!calls.register(2, t).unwrap().alone);
        assert_eq!(calls.poll(1, &mut cx()), Poll::Pending);
        assert!(calls.complete(1, Ok(5)));
        assert!(!calls.complete(1, Ok(6)), "first result stays");
        calls.end("gone");
        assert_eq!(calls.poll(1, &mut cx()), Poll::Ready(Some(Ok(5))));
        assert_eq!(calls.poll(2, &mut cx()), Poll::Ready(Some(Err("gone"))));
        assert_eq!(calls.poll(2, &mut cx()), Poll::Ready(None));
        assert_eq!(calls.register(3, t), Err("gone"));
        assert!(calls.is_empty());
    }

    #[test]
    fn overdue_requests_fail_and_the_timer_never_sleeps_past_the_lead() {
        let calls: Calls<u32, &str> = Calls::new();
        let base = Instant::now();
        let lead = Duration::from_secs(60);
        // Idle: armed at now + lead.
        assert_eq!(calls.expire(base, lead, || "late"), base + lead);
        // A request registered later has a later deadline: no wake needed.
        let r = calls.register(1, base + Duration::from_secs(61)).unwrap();
        assert!(!r.wake_driver);
        // One with an earlier deadline than the timer asks for a wake.
        let r = calls.register(2, base + Duration::from_secs(5)).unwrap();
        assert!(r.wake_driver);
        let next = calls.expire(base + Duration::from_secs(5), lead, || "late");
        assert_eq!(next, base + Duration::from_secs(61));
        assert_eq!(calls.poll(2, &mut cx()), Poll::Ready(Some(Err("late"))));
        assert_eq!(calls.poll(1, &mut cx()), Poll::Pending);
        calls.cancel(1);
        assert!(calls.is_empty());
        let later = base + Duration::from_secs(6);
        assert_eq!(calls.expire(later, lead, || "late"), later + lead);
    }
}
