//! Who connects to whom: the table of this rank's connections, which the
//! worker (dialling) and the acceptor (answering) share.
//!
//! The rule: either rank of a pair dials when an op first needs the other;
//! a pair keeps exactly one connection. When both dial at once, the
//! connection dialled by the lower rank is kept: the lower rank's acceptor
//! refuses the higher rank's hello while its own dial to that rank is out
//! (or done), answering with `HELLO_DUP`; the higher rank's acceptor always
//! takes a lower rank's connection. The higher rank, refused, waits for the
//! lower rank's connection to arrive (bounded by the connect timeout). Both
//! sides decide under this table's lock, so a rank never both accepts and
//! dials the same peer.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use chorus_core::sync::lock;
use tokio::sync::Notify;

/// Where the connection to one peer stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// No connection, and none on the way.
    Idle,
    /// The worker dials the peer.
    Dialing,
    /// The peer refused this rank's dial: its own is on the way.
    Awaiting,
    /// The acceptor runs the handshake of the peer's connection.
    Accepting,
    /// Connected.
    Up,
}

/// What the acceptor does with a connection from a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Taking {
    /// Take it: it is the pair's connection.
    Take,
    /// Refuse it with `HELLO_DUP`: this rank's own dial is the pair's.
    Dup,
    /// Drop it unanswered: this rank stopped.
    Closed,
}

/// What the worker should do about a peer it needs; `T`: a connection
/// ready for use.
#[derive(Debug)]
pub(super) enum Next<T> {
    /// The peer's connection arrived: take it.
    Ready(T),
    /// Dial it (the table now says so).
    Dial,
    /// A connection is on its way from the peer: wait for [`Links::arrived`].
    Wait,
}

#[derive(Debug)]
struct Table<T> {
    state: Vec<State>,
    ready: Vec<Option<T>>,
    closed: bool,
}

/// The table of one rank's connections; `T`: a connection the acceptor
/// made, ready for the worker.
#[derive(Debug)]
pub(super) struct Links<T> {
    me: usize,
    table: Mutex<Table<T>>,
    /// Connections made so far (both directions).
    opened: AtomicUsize,
    /// Some connection arrived that the worker has not taken yet.
    waiting: AtomicBool,
    /// Woken when a connection arrives or a handshake fails.
    pub(super) arrived: Notify,
}

impl<T> Links<T> {
    pub(super) fn new(me: usize, size: usize) -> Links<T> {
        Links {
            me,
            table: Mutex::new(Table {
                state: vec![State::Idle; size],
                ready: (0..size).map(|_| None).collect(),
                closed: false,
            }),
            opened: AtomicUsize::new(0),
            waiting: AtomicBool::new(false),
            arrived: Notify::new(),
        }
    }

    /// Connections this rank has made or taken so far.
    pub(super) fn opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }

    /// The worker needs `peer`: what to do now.
    pub(super) fn next(&self, peer: usize) -> Next<T> {
        let mut t = lock(&self.table);
        if let Some(i) = t.ready.get_mut(peer).and_then(Option::take) {
            return Next::Ready(i);
        }
        match t.state.get(peer) {
            Some(State::Idle) => {
                t.state[peer] = State::Dialing;
                Next::Dial
            }
            _ => Next::Wait,
        }
    }

    /// The worker's dial to `peer` was refused: the peer's own is coming.
    pub(super) fn refused(&self, peer: usize) {
        let mut t = lock(&self.table);
        if t.state[peer] == State::Dialing {
            t.state[peer] = State::Awaiting;
        }
    }

    /// The worker's dial to `peer` failed.
    pub(super) fn dial_failed(&self, peer: usize) {
        let mut t = lock(&self.table);
        if t.state[peer] == State::Dialing {
            t.state[peer] = State::Idle;
        }
    }

    /// The worker's dial to `peer` made the pair's connection.
    pub(super) fn dialled(&self, peer: usize) {
        lock(&self.table).state[peer] = State::Up;
        self.opened.fetch_add(1, Ordering::Relaxed);
    }

    /// The acceptor has a hello from `peer`: whether it takes the
    /// connection (and then runs its handshake to the end).
    pub(super) fn take(&self, peer: usize) -> Taking {
        let mut t = lock(&self.table);
        if t.closed {
            return Taking::Closed;
        }
        let take = match t.state[peer] {
            State::Idle | State::Awaiting => true,
            // Both dial: the lower rank's connection is the pair's.
            State::Dialing => peer < self.me,
            State::Accepting | State::Up => false,
        };
        if !take {
            return Taking::Dup;
        }
        t.state[peer] = State::Accepting;
        Taking::Take
    }

    /// The handshake of a connection the acceptor took from `peer` failed.
    pub(super) fn accept_failed(&self, peer: usize) {
        {
            let mut t = lock(&self.table);
            if t.state[peer] == State::Accepting {
                t.state[peer] = State::Idle;
            }
        }
        self.arrived.notify_waiters();
    }

    /// A connection from `peer` is ready for the worker. Gives it back
    /// when the table is closed (the backend stopped).
    pub(super) fn arrive(&self, peer: usize, i: T) -> Result<(), T> {
        {
            let mut t = lock(&self.table);
            if t.closed {
                return Err(i);
            }
            t.state[peer] = State::Up;
            t.ready[peer] = Some(i);
            self.waiting.store(true, Ordering::Release);
        }
        self.opened.fetch_add(1, Ordering::Relaxed);
        self.arrived.notify_waiters();
        Ok(())
    }

    /// Every connection that arrived and the worker has not taken yet.
    pub(super) fn take_arrived(&self) -> Vec<(usize, T)> {
        if !self.waiting.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut t = lock(&self.table);
        self.waiting.store(false, Ordering::Release);
        t.ready
            .iter_mut()
            .enumerate()
            .filter_map(|(p, r)| r.take().map(|r| (p, r)))
            .collect()
    }

    /// The backend stopped: no more connections are taken.
    pub(super) fn close(&self) {
        let dropped: Vec<_> = {
            let mut t = lock(&self.table);
            t.closed = true;
            t.ready.iter_mut().filter_map(Option::take).collect()
        };
        drop(dropped);
        self.arrived.notify_waiters();
    }

    /// Whether the backend stopped taking connections.
    pub(super) fn is_closed(&self) -> bool {
        lock(&self.table).closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn when_both_dial_the_lower_ranks_connection_is_kept() {
        // Rank 1 and rank 3 dial each other at once.
        let low = Links::<()>::new(1, 4);
        let high = Links::<()>::new(3, 4);
        assert!(matches!(low.next(3), Next::Dial));
        assert!(matches!(high.next(1), Next::Dial));
        // The lower rank refuses the higher one's hello ...
        assert_eq!(low.take(3), Taking::Dup);
        // ... and the higher one takes the lower one's.
        assert_eq!(high.take(1), Taking::Take);
        high.refused(1);
        // The higher rank then waits for the lower one's connection.
        assert!(matches!(high.next(1), Next::Wait));
    }

    #[test]
    fn a_peer_that_is_not_dialled_is_taken_once() {
        let l = Links::<()>::new(0, 3);
        assert_eq!(l.take(2), Taking::Take);
        assert_eq!(
            l.take(2),
            Taking::Dup,
            "a second connection from the same peer"
        );
        assert!(matches!(l.next(2), Next::Wait));
        l.accept_failed(2);
        assert!(matches!(l.next(2), Next::Dial));
        l.dial_failed(2);
        assert!(matches!(l.next(2), Next::Dial));
        l.dialled(2);
        assert_eq!(l.take(2), Taking::Dup);
        assert_eq!(l.opened(), 1);
    }

    #[test]
    fn a_closed_table_takes_nothing() {
        let l = Links::<()>::new(0, 2);
        l.close();
        assert!(l.is_closed());
        assert_eq!(l.take(1), Taking::Closed);
    }
}
