//! The protocol of a group's *board*: one shared-memory area where every
//! rank of a group that lives on one host writes its part of an op once
//! and reads everyone's (the TCP backend's small ops among local ranks;
//! `backend::tcp::board` in `chorus`). The loom suite checks it.
//!
//! Board ops are numbered `k = 0, 1, 2, …` in the order every rank runs
//! them. Each rank has two slots, one for even and one for odd `k`
//! ([`parity`]). For op `k` a rank writes its slot of `k`'s parity, then
//! *arrives* ([`Board::arrive`]); once all `n` ranks have arrived, every
//! rank reads every slot.
//!
//! Three shared words:
//!
//! * `arrived`: the arrivals so far, over all ops. Op `k`'s are arrivals
//!   `k·n + 1 ..= (k + 1)·n`: no rank arrives at op `k + 1` before op `k`
//!   is done for it, which takes all `n` arrivals at `k`. So the rank
//!   whose arrival is number `(k + 1)·n` is the last one at `k`.
//! * `done`: [`mark`]`(k)` once op `k` is done. The last arriver stores it;
//!   a rank waiting for op `k` sees either `mark(k − 1)` or `mark(k)`.
//! * `sleepers`: threads about to block until `done` changes (a futex on
//!   it). The last arriver wakes them only when there are any.
//!
//! **Memory order.** A rank's slot writes come before its arrival (a
//! read-modify-write with release); the arrivals form one chain that the
//! last arriver acquires, and its store of `done` releases it all to the
//! readers. A slot of parity `p` is written again for op `k + 2` only
//! after its writer saw op `k + 1` done, so after every rank arrived at
//! `k + 1`, so after every rank finished reading op `k`'s slots.
//!
//! **Sleeping.** A sleeper adds itself to `sleepers`, then reads `done`;
//! the last arriver stores `done`, then looks at `sleepers`; both fence
//! (sequentially consistent) between the two, so one of the two sees
//! the other's store. A
//! sleeper whose op is not done by the value it read blocks only while
//! `done` still holds that value (the futex compares it), so the wake-up
//! cannot fall between its look and its sleep.

use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};

/// The board's shared words (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct Words<'a> {
    /// Arrivals so far, over all ops.
    pub arrived: &'a AtomicU64,
    /// [`mark`] of the last op done.
    pub done: &'a AtomicU32,
    /// Threads about to block until `done` changes.
    pub sleepers: &'a AtomicU32,
}

/// The slot (0 or 1) of op `k`.
pub fn parity(k: u64) -> usize {
    (k & 1) as usize
}

/// The value of `done` once op `k` is done (it wraps, and a waiter only
/// ever compares it with the value of the op before).
pub fn mark(k: u64) -> u32 {
    k.wrapping_add(1) as u32
}

/// What an arrival found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Others are still to come.
    Early,
    /// This rank was the last: the op is done. With `wake`, threads may
    /// be blocked on `done`: wake them all.
    Last {
        /// Some thread is (about to be) blocked on `done`.
        wake: bool,
    },
}

/// One rank's view of a board of `n` ranks.
#[derive(Debug, Clone, Copy)]
pub struct Board<'a> {
    words: Words<'a>,
    n: u64,
}

impl<'a> Board<'a> {
    /// The board of `n` ranks on `words`.
    pub fn new(words: Words<'a>, n: usize) -> Board<'a> {
        Board { words, n: n as u64 }
    }

    /// This rank arrives at op `k`, its slot for `k` written.
    pub fn arrive(&self, k: u64) -> Arrival {
        let a = self.words.arrived.fetch_add(1, Ordering::AcqRel) + 1;
        if a != (k + 1) * self.n {
            return Arrival::Early;
        }
        self.words.done.store(mark(k), Ordering::SeqCst);
        fence(Ordering::SeqCst);
        Arrival::Last {
            wake: self.words.sleepers.load(Ordering::SeqCst) > 0,
        }
    }

    /// Whether op `k` is done: every rank arrived, and every slot of `k`
    /// may be read.
    pub fn is_done(&self, k: u64) -> bool {
        self.words.done.load(Ordering::Acquire) == mark(k)
    }

    /// A thread is about to block until `done` changes: counts it among
    /// the sleepers and returns the value of `done` to block on. Before
    /// it blocks, it must look whether what it waits for is done already
    /// (op `k` is when the value is [`mark`]`(k)`); either way it calls
    /// [`woke`](Self::woke) once awake (or at once, if it does not block).
    pub fn sleep(&self) -> u32 {
        self.words.sleepers.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        self.words.done.load(Ordering::SeqCst)
    }

    /// The thread that called [`sleep`](Self::sleep) is awake.
    pub fn woke(&self) {
        self.words.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_nth_arrival_of_an_op_is_the_last_and_marks_it_done() {
        let (arrived, done, sleepers) = (AtomicU64::new(0), AtomicU32::new(0), AtomicU32::new(0));
        let b = Board::new(
            Words {
                arrived: &arrived,
                done: &done,
                sleepers: &sleepers,
            },
            3,
        );
        for k in 0..3 {
            assert!(!b.is_done(k));
            assert_eq!(b.arrive(k), Arrival::Early);
            assert_eq!(b.arrive(k), Arrival::Early);
            assert_eq!(b.sleep(), mark(k.wrapping_sub(1)));
            assert_eq!(b.arrive(k), Arrival::Last { wake: true });
            b.woke();
            assert!(b.is_done(k));
            assert_eq!(b.sleep(), mark(k));
            b.woke();
            assert_eq!(parity(k), k as usize % 2);
        }
        assert_eq!(b.arrive(3), Arrival::Early);
        assert_eq!(b.arrive(3), Arrival::Early);
        assert_eq!(b.arrive(3), Arrival::Last { wake: false });
    }
}
