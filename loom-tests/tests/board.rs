//! Loom models of a group board's protocol (`chorus_core::board`): ranks
//! write their slot of each op, arrive, and read every rank's slot once
//! the last one arrived, sleeping on the `done` word (a futex) when it is
//! not yet done. Checked: every rank reads every rank's value of that op
//! (no slot is rewritten before all have read it: op `k + 2` reuses op
//! `k`'s slots), and no wake-up is lost (a lost one deadlocks the model).
//! The check itself: a sleeper that reads `done` before it counts itself
//! among the sleepers is caught losing a wake-up.
#![forbid(unsafe_code)]
#![cfg(loom)]

use chorus_core::board::{mark, parity, Arrival, Board, Words};
use chorus_loom_tests::model;
use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

/// The board's shared memory: its words, two slots per rank (plain
/// relaxed words: only the protocol orders them) and a stand-in for the
/// futex on `done` (the kernel compares the word and queues the sleeper
/// under one lock, as this mutex does).
struct Shared {
    arrived: AtomicU64,
    done: AtomicU32,
    sleepers: AtomicU32,
    slots: Vec<[AtomicU64; 2]>,
    futex: Mutex<()>,
    woken: Condvar,
}

impl Shared {
    fn new(n: usize) -> Arc<Shared> {
        Arc::new(Shared {
            arrived: AtomicU64::new(0),
            done: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            slots: (0..n)
                .map(|_| [AtomicU64::new(0), AtomicU64::new(0)])
                .collect(),
            futex: Mutex::new(()),
            woken: Condvar::new(),
        })
    }

    fn board(&self) -> Board<'_> {
        Board::new(
            Words {
                arrived: &self.arrived,
                done: &self.done,
                sleepers: &self.sleepers,
            },
            self.slots.len(),
        )
    }

    /// FUTEX_WAIT: sleeps while `done` holds `seen`.
    fn futex_wait(&self, seen: u32) {
        let g = self.futex.lock().unwrap();
        if self.done.load(Ordering::SeqCst) == seen {
            drop(self.woken.wait(g).unwrap());
        }
    }

    /// FUTEX_WAKE of every sleeper.
    fn futex_wake(&self) {
        let _g = self.futex.lock().unwrap();
        self.woken.notify_all();
    }
}

/// What rank `r` writes for op `k`.
fn value(r: usize, k: u64) -> u64 {
    100 * (r as u64 + 1) + k
}

/// How a waiting rank goes to sleep: the protocol's way, or the broken
/// one (read `done`, then count itself a sleeper).
#[derive(Clone, Copy, PartialEq)]
enum Sleeper {
    Protocol,
    LooksFirst,
}

/// Rank `me` runs `ops` board ops.
fn rank(s: &Shared, me: usize, ops: u64, how: Sleeper) {
    let b = s.board();
    for k in 0..ops {
        let p = parity(k);
        s.slots[me][p].store(value(me, k), Ordering::Relaxed);
        if b.arrive(k) == (Arrival::Last { wake: true }) {
            s.futex_wake();
        }
        while !b.is_done(k) {
            let seen = match how {
                Sleeper::Protocol => b.sleep(),
                Sleeper::LooksFirst => {
                    let seen = s.done.load(Ordering::SeqCst);
                    s.sleepers.fetch_add(1, Ordering::SeqCst);
                    seen
                }
            };
            if seen != mark(k) {
                s.futex_wait(seen);
            }
            b.woke();
        }
        for (r, slot) in s.slots.iter().enumerate() {
            assert_eq!(
                slot[p].load(Ordering::Relaxed),
                value(r, k),
                "rank {me} read rank {r}'s slot of op {k}"
            );
        }
    }
}

/// `n` ranks run `ops` ops each.
fn run(n: usize, ops: u64, how: Sleeper) {
    let s = Shared::new(n);
    let others: Vec<_> = (1..n)
        .map(|me| {
            let s = s.clone();
            thread::spawn(move || rank(&s, me, ops, how))
        })
        .collect();
    rank(&s, 0, ops, how);
    for t in others {
        t.join().unwrap();
    }
}

/// Two ranks, three ops: op 2 rewrites op 0's slots.
#[test]
fn two_ranks_read_every_value_across_slot_reuse() {
    model(|| run(2, 3, Sleeper::Protocol));
}

/// Three ranks, two ops: the last arriver wakes two sleepers.
#[test]
fn three_ranks_read_every_value_and_no_wake_up_is_lost() {
    model(|| run(3, 2, Sleeper::Protocol));
}

/// The check itself: a sleeper that looks at `done` before it counts
/// itself misses the last arriver's wake-up.
#[test]
#[should_panic(expected = "deadlock")]
fn looking_before_counting_is_caught() {
    model(|| run(2, 1, Sleeper::LooksFirst));
}
