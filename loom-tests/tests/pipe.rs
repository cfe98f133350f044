//! Loom models of the shared-memory pipe's protocol (`chorus_core::pipe`):
//! bytes come out in order across the ring's wrap-around while the reader
//! lags and both sides sleep and wake each other (no lost wake-up: a lost
//! one deadlocks the model), and a writer that dies in the middle of a
//! frame leaves nothing of it visible.
#![forbid(unsafe_code)]
#![cfg(loom)]

use chorus_core::pipe::{Rx, Tx, Wake, Words};
use chorus_loom_tests::model;
use loom::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

/// The shared memory of one pipe: its words, its ring, and the stand-in
/// for the socket a sleeping side is woken through (a count of wake-ups
/// and whether the writer is gone).
struct Shared {
    head: AtomicU64,
    tail: AtomicU64,
    reader_asleep: AtomicU32,
    writer_asleep: AtomicU32,
    ring: Vec<AtomicU8>,
    bell: Mutex<Bell>,
    rung: Condvar,
}

#[derive(Default)]
struct Bell {
    for_reader: usize,
    for_writer: usize,
    writer_gone: bool,
}

impl Shared {
    fn new(cap: usize) -> Arc<Shared> {
        Arc::new(Shared {
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            reader_asleep: AtomicU32::new(0),
            writer_asleep: AtomicU32::new(0),
            ring: (0..cap).map(|_| AtomicU8::new(0)).collect(),
            bell: Mutex::new(Bell::default()),
            rung: Condvar::new(),
        })
    }

    fn words(&self) -> Words<'_> {
        Words {
            head: &self.head,
            tail: &self.tail,
            reader_asleep: &self.reader_asleep,
            writer_asleep: &self.writer_asleep,
        }
    }

    fn ring_reader(&self, wake: Wake) {
        if wake == Wake::Peer {
            self.bell.lock().unwrap().for_reader += 1;
            self.rung.notify_all();
        }
    }

    fn ring_writer(&self, wake: Wake) {
        if wake == Wake::Peer {
            self.bell.lock().unwrap().for_writer += 1;
            self.rung.notify_all();
        }
    }

    /// The reader sleeps until rung (or the writer is gone); whether the
    /// writer is gone.
    fn reader_waits(&self) -> bool {
        let mut b = self.bell.lock().unwrap();
        while b.for_reader == 0 && !b.writer_gone {
            b = self.rung.wait(b).unwrap();
        }
        b.for_reader = b.for_reader.saturating_sub(1);
        b.writer_gone
    }

    fn writer_waits(&self) {
        let mut b = self.bell.lock().unwrap();
        while b.for_writer == 0 {
            b = self.rung.wait(b).unwrap();
        }
        b.for_writer -= 1;
    }
}

/// Writes `src` whole, sleeping for space as the backend's writer does.
fn write_all(sh: &Shared, tx: &mut Tx, src: &[u8]) {
    let mut done = 0;
    while done < src.len() {
        let w = sh.words();
        let r = tx.space(&w);
        if r.is_empty() {
            if tx.sleep(&w) {
                sh.writer_waits();
            }
            continue;
        }
        let n = r.len().min(src.len() - done);
        for (i, b) in src[done..done + n].iter().enumerate() {
            sh.ring[r.start + i].store(*b, Ordering::Relaxed);
        }
        let wake = tx.commit(&w, n);
        sh.ring_reader(wake);
        done += n;
    }
}

/// Reads until `want` bytes came or the writer is gone and nothing is
/// left, sleeping for data as the backend's reader does.
fn read_up_to(sh: &Shared, rx: &mut Rx, want: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut gone = false;
    while out.len() < want {
        let w = sh.words();
        let r = rx.data(&w);
        if r.is_empty() {
            if gone {
                break;
            }
            if rx.sleep(&w) {
                gone = sh.reader_waits();
            }
            continue;
        }
        // Read one byte at a time: the reader lags behind the writer.
        out.push(sh.ring[r.start].load(Ordering::Relaxed));
        let wake = rx.consume(&w, 1);
        sh.ring_writer(wake);
    }
    out
}

#[test]
fn bytes_come_out_in_order_across_the_wrap_with_a_slow_reader() {
    model(|| {
        const CAP: usize = 3;
        let sh = Shared::new(CAP);
        let src: Vec<u8> = vec![10, 11, 12, 13, 14];
        let writer = {
            let sh = sh.clone();
            let src = src.clone();
            thread::spawn(move || {
                let mut tx = Tx::new(CAP);
                // Two frames; the second wraps around the ring.
                write_all(&sh, &mut tx, &src[..2]);
                write_all(&sh, &mut tx, &src[2..]);
            })
        };
        let mut rx = Rx::new(CAP);
        let got = read_up_to(&sh, &mut rx, src.len());
        writer.join().unwrap();
        assert_eq!(got, src);
    });
}

#[test]
fn a_writer_that_dies_mid_frame_leaves_nothing_of_it_visible() {
    model(|| {
        const CAP: usize = 4;
        let sh = Shared::new(CAP);
        let writer = {
            let sh = sh.clone();
            thread::spawn(move || {
                let mut tx = Tx::new(CAP);
                write_all(&sh, &mut tx, &[1, 2]);
                // The next frame's bytes go into the ring, but the writer
                // dies before it commits them.
                let r = tx.space(&sh.words());
                for i in r.take(2) {
                    sh.ring[i].store(99, Ordering::Relaxed);
                }
                let mut b = sh.bell.lock().unwrap();
                b.writer_gone = true;
                sh.rung.notify_all();
            })
        };
        let mut rx = Rx::new(CAP);
        let got = read_up_to(&sh, &mut rx, 4);
        writer.join().unwrap();
        assert_eq!(got, vec![1, 2], "only the committed frame is seen");
    });
}
