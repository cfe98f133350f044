//! The protocol of a one-way byte pipe in shared memory between two
//! processes: one writer, one reader, a ring of `cap` bytes, and who must
//! wake whom. The TCP backend's shared-memory pipes between local ranks
//! run it over words in a mapped segment (`backend::tcp::shm` in
//! `chorus`); the loom suite runs it over loom's atomics.
//!
//! Four shared words ([`Words`]): `head`, the bytes ever written and
//! published; `tail`, the bytes ever read and given back; and one flag per
//! side saying that side sleeps (the reader for data, the writer for
//! space). Each side keeps its own counter locally ([`Tx`], [`Rx`]) and
//! only stores it into its word, so a word has a single writer:
//!
//! * the writer copies bytes into the ring at [`Tx::space`] and publishes
//!   them with [`Tx::commit`] (a release store of `head`); bytes it has not
//!   committed are never seen, so a writer that dies in the middle of a
//!   frame leaves nothing half-written in the reader's view;
//! * the reader copies published bytes from [`Rx::data`] and gives them
//!   back with [`Rx::consume`] (a release store of `tail`);
//! * a side that finds nothing to do says it sleeps ([`Tx::sleep`],
//!   [`Rx::sleep`]: store the flag, then look again, both sequentially
//!   consistent), and the other side, after it published or freed bytes,
//!   looks at the flag (`commit` and `consume` return [`Wake::Peer`]) and
//!   wakes it by other means (a byte on a socket). Of the two looks, one
//!   sees the other's store: no wake-up is lost, and a side that is busy
//!   costs the other no wake-up at all.

use std::ops::Range;

use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};

/// A side sleeps.
const ASLEEP: u32 = 1;
/// A side runs (or does not wait).
const AWAKE: u32 = 0;

/// The shared words of one pipe, wherever they live.
#[derive(Debug, Clone, Copy)]
pub struct Words<'a> {
    /// Bytes ever written and published (only the writer stores it).
    pub head: &'a AtomicU64,
    /// Bytes ever read and given back (only the reader stores it).
    pub tail: &'a AtomicU64,
    /// The reader sleeps, waiting for data (the reader sets it, either
    /// side clears it).
    pub reader_asleep: &'a AtomicU32,
    /// The writer sleeps, waiting for space (the writer sets it, either
    /// side clears it).
    pub writer_asleep: &'a AtomicU32,
}

/// Whether the other side must be woken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a sleeping peer must be woken"]
pub enum Wake {
    /// It runs, or waits for nothing this call gave it.
    None,
    /// It sleeps waiting for what this call gave it: wake it.
    Peer,
}

/// Clears `flag` if it is set; whether it was.
fn take_asleep(flag: &AtomicU32) -> Wake {
    if flag.load(Ordering::SeqCst) == ASLEEP && flag.swap(AWAKE, Ordering::SeqCst) == ASLEEP {
        Wake::Peer
    } else {
        Wake::None
    }
}

/// The ring's byte offsets of the `n` bytes that start at stream position
/// `at`, up to the ring's end (the rest wraps to offset 0).
fn contiguous(at: u64, n: u64, cap: u64) -> Range<usize> {
    let start = at % cap;
    let len = n.min(cap - start);
    start as usize..(start + len) as usize
}

/// The writer's side of a pipe of `cap` bytes.
#[derive(Debug)]
pub struct Tx {
    cap: u64,
    /// Bytes written so far (this side's copy of `head`).
    head: u64,
}

impl Tx {
    /// The writer of a fresh pipe of `cap` bytes (at least 1).
    pub fn new(cap: usize) -> Tx {
        Tx {
            cap: cap.max(1) as u64,
            head: 0,
        }
    }

    /// Where the next bytes may be written: a contiguous range of the
    /// ring (empty when it is full; shorter than the free space where the
    /// free space wraps).
    pub fn space(&self, w: &Words<'_>) -> Range<usize> {
        let tail = w.tail.load(Ordering::Acquire);
        // A `tail` that is not within the last `cap` bytes written is not
        // one the protocol can produce (a corrupt peer): no space.
        let used = self.head.wrapping_sub(tail);
        if used > self.cap {
            return 0..0;
        }
        contiguous(self.head, self.cap - used, self.cap)
    }

    /// Publishes `n` bytes written at the start of [`space`](Self::space);
    /// whether the reader sleeps and must be woken.
    pub fn commit(&mut self, w: &Words<'_>, n: usize) -> Wake {
        self.head += n as u64;
        w.head.store(self.head, Ordering::Release);
        fence(Ordering::SeqCst);
        take_asleep(w.reader_asleep)
    }

    /// Before the writer sleeps for space: says so, then looks again.
    /// `false` when space came meanwhile (do not sleep); `true` when the
    /// reader will wake it once it frees bytes.
    pub fn sleep(&self, w: &Words<'_>) -> bool {
        w.writer_asleep.store(ASLEEP, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !self.space(w).is_empty() {
            w.writer_asleep.store(AWAKE, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.head
    }
}

/// The reader's side of a pipe of `cap` bytes.
#[derive(Debug)]
pub struct Rx {
    cap: u64,
    /// Bytes read so far (this side's copy of `tail`).
    tail: u64,
}

impl Rx {
    /// The reader of a fresh pipe of `cap` bytes (at least 1).
    pub fn new(cap: usize) -> Rx {
        Rx {
            cap: cap.max(1) as u64,
            tail: 0,
        }
    }

    /// The next published bytes: a contiguous range of the ring (empty when
    /// there is none; shorter than what was published where it wraps).
    pub fn data(&self, w: &Words<'_>) -> Range<usize> {
        let head = w.head.load(Ordering::Acquire);
        // A `head` that is not within `cap` bytes ahead of what was read
        // is not one the protocol can produce (a corrupt peer): no data.
        let avail = head.wrapping_sub(self.tail);
        if avail > self.cap {
            return 0..0;
        }
        contiguous(self.tail, avail, self.cap)
    }

    /// Gives back `n` bytes read at the start of [`data`](Self::data);
    /// whether the writer sleeps for space and must be woken.
    pub fn consume(&mut self, w: &Words<'_>, n: usize) -> Wake {
        self.tail += n as u64;
        w.tail.store(self.tail, Ordering::Release);
        fence(Ordering::SeqCst);
        take_asleep(w.writer_asleep)
    }

    /// Before the reader sleeps for data: says so, then looks again.
    /// `false` when data came meanwhile (do not sleep); `true` when the
    /// writer will wake it once it publishes bytes.
    pub fn sleep(&self, w: &Words<'_>) -> bool {
        w.reader_asleep.store(ASLEEP, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !self.data(w).is_empty() {
            w.reader_asleep.store(AWAKE, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// The reader looks at the pipe itself for a while (it spins): the
    /// writer need not ring. It says [`sleep`](Self::sleep) again before it
    /// stops looking.
    pub fn watch(&self, w: &Words<'_>) {
        if w.reader_asleep.load(Ordering::Relaxed) == ASLEEP {
            w.reader_asleep.store(AWAKE, Ordering::SeqCst);
        }
    }

    /// Bytes read so far.
    pub fn read(&self) -> u64 {
        self.tail
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    struct Shared {
        head: AtomicU64,
        tail: AtomicU64,
        r: AtomicU32,
        w: AtomicU32,
    }

    impl Shared {
        fn new() -> Shared {
            Shared {
                head: AtomicU64::new(0),
                tail: AtomicU64::new(0),
                r: AtomicU32::new(0),
                w: AtomicU32::new(0),
            }
        }

        fn words(&self) -> Words<'_> {
            Words {
                head: &self.head,
                tail: &self.tail,
                reader_asleep: &self.r,
                writer_asleep: &self.w,
            }
        }
    }

    /// Writes all of `src` that fits; how much.
    fn put(tx: &mut Tx, w: &Words<'_>, ring: &mut [u8], src: &[u8]) -> usize {
        let mut done = 0;
        while done < src.len() {
            let r = tx.space(w);
            if r.is_empty() {
                break;
            }
            let n = r.len().min(src.len() - done);
            ring[r.start..r.start + n].copy_from_slice(&src[done..done + n]);
            let _ = tx.commit(w, n);
            done += n;
        }
        done
    }

    fn get(rx: &mut Rx, w: &Words<'_>, ring: &[u8], out: &mut Vec<u8>) {
        loop {
            let r = rx.data(w);
            if r.is_empty() {
                return;
            }
            out.extend_from_slice(&ring[r.clone()]);
            let _ = rx.consume(w, r.len());
        }
    }

    #[test]
    fn bytes_come_out_in_order_across_many_wraps() {
        let sh = Shared::new();
        let w = sh.words();
        let mut ring = vec![0u8; 13];
        let (mut tx, mut rx) = (Tx::new(13), Rx::new(13));
        let src: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        let mut out = Vec::new();
        let mut at = 0;
        let mut step = 1;
        while at < src.len() {
            let end = (at + step).min(src.len());
            at += put(&mut tx, &w, &mut ring, &src[at..end]);
            get(&mut rx, &w, &ring, &mut out);
            step = step % 17 + 1;
        }
        assert_eq!(out, src);
        assert_eq!((tx.written(), rx.read()), (10_000, 10_000));
    }

    #[test]
    fn a_full_ring_takes_nothing_and_a_sleeping_side_is_woken_once() {
        let sh = Shared::new();
        let w = sh.words();
        let mut ring = vec![0u8; 8];
        let (mut tx, mut rx) = (Tx::new(8), Rx::new(8));
        // The reader sleeps on an empty pipe; the first commit wakes it,
        // the next one has nobody to wake.
        assert!(rx.sleep(&w));
        assert_eq!(put(&mut tx, &w, &mut ring, &[1; 3]), 3);
        assert_eq!(sh.r.load(Ordering::SeqCst), AWAKE);
        assert_eq!(tx.commit(&w, 0), Wake::None);
        // Full: no space, and the writer may sleep; freeing bytes wakes it.
        assert_eq!(put(&mut tx, &w, &mut ring, &[2; 9]), 5);
        assert!(tx.space(&w).is_empty());
        assert!(tx.sleep(&w));
        let r = rx.data(&w);
        assert_eq!(&ring[r.clone()], &[1, 1, 1, 2, 2, 2, 2, 2]);
        assert_eq!(rx.consume(&w, 2), Wake::Peer);
        assert_eq!(rx.consume(&w, 1), Wake::None);
        // A side that finds work when it says it sleeps does not sleep.
        assert!(!tx.sleep(&w));
        assert!(!rx.sleep(&w));
    }

    #[test]
    fn uncommitted_bytes_are_never_seen() {
        let sh = Shared::new();
        let w = sh.words();
        let (tx, rx) = (Tx::new(16), Rx::new(16));
        // The writer took space and "died" before committing.
        assert_eq!(tx.space(&w), 0..16);
        assert!(rx.data(&w).is_empty());
        assert!(rx.sleep(&w));
    }
}
