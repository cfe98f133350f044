//! Loom model of the linger hand-over (`chorus_core::linger`): a caller
//! that leaves a pipe reader lingering after its op races a worker that
//! takes the next op and waits for frames on its host, and the sweep. The
//! property: when the worker waits with an op in hand, the reader is never
//! left lingering unseen — its host polls it to sleep (so the writer will
//! ring), or the caller put it to sleep itself.
#![forbid(unsafe_code)]
#![cfg(loom)]

use chorus_core::linger::Linger;
use chorus_loom_tests::model;
use loom::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use loom::sync::Arc;
use loom::thread;

/// The reader's last poll left it asleep (its writer rings).
const ASLEEP: u8 = 0;
/// The reader's last poll left it lingering (its writer does not ring).
const LINGERING: u8 = 1;

struct Group {
    linger: Linger,
    /// The state the reader's last poll left.
    reader: AtomicU8,
    /// A wake-up reached the reader; its host polls it (to sleep) once the
    /// caller that holds it lets go.
    woken: AtomicBool,
}

impl Group {
    /// A group whose worker is idle and whose reader's last poll left it
    /// `reader`.
    fn new(reader: u8) -> Arc<Group> {
        let g = Group {
            linger: Linger::new(),
            reader: AtomicU8::new(reader),
            woken: AtomicBool::new(false),
        };
        g.linger.set_idle(true);
        Arc::new(g)
    }

    fn wake_readers(&self) {
        self.woken.store(true, Ordering::SeqCst);
    }

    /// The reader once every claim is gone: a woken reader is polled by
    /// its host, which says it sleeps.
    fn settled(&self) -> u8 {
        if self.woken.load(Ordering::SeqCst) {
            ASLEEP
        } else {
            self.reader.load(Ordering::SeqCst)
        }
    }
}

/// The caller of the op before: its op is done, the worker idle. It polls
/// the reader lingering, marks it, and puts it to sleep if the worker was
/// not idle after all.
fn caller(g: &Group) {
    g.reader.store(LINGERING, Ordering::SeqCst);
    if !g.linger.mark().keep {
        g.reader.store(ASLEEP, Ordering::SeqCst);
    }
}

/// Runs `f` on a thread of its own with the group.
fn spawn(g: &Arc<Group>, f: impl FnOnce(&Group) + Send + 'static) -> thread::JoinHandle<()> {
    let g = g.clone();
    thread::spawn(move || f(&g))
}

/// Joins `threads`, then the reader as its host leaves it.
fn settle(g: &Group, threads: Vec<thread::JoinHandle<()>>) -> u8 {
    for t in threads {
        t.join().unwrap();
    }
    g.settled()
}

/// A submitter queues the next op and the worker takes it on its host,
/// then waits for frames: it ends any linger first.
fn worker(g: &Group) {
    g.linger.set_idle(false);
    if g.linger.end() {
        g.wake_readers();
    }
}

#[test]
fn a_worker_that_waits_on_its_host_never_finds_a_reader_lingering_unseen() {
    model(|| {
        let g = Group::new(ASLEEP);
        let threads = vec![spawn(&g, caller), spawn(&g, worker)];
        let reader = settle(&g, threads);
        assert_eq!(
            reader, ASLEEP,
            "the worker waits on a reader left lingering unseen"
        );
    });
}

/// The same race after an earlier linger that the sweep ends meanwhile:
/// the flag was already set when the caller marked it, and cleared by the
/// sweep at any point.
#[test]
fn a_sweep_ending_an_earlier_linger_loses_no_mark() {
    model(|| {
        let g = Group::new(LINGERING);
        assert!(g.linger.mark().keep);
        let sweep = |g: &Group| {
            if g.linger.end() {
                g.wake_readers();
            }
        };
        let threads = vec![spawn(&g, caller), spawn(&g, sweep), spawn(&g, worker)];
        let reader = settle(&g, threads);
        assert_eq!(
            reader, ASLEEP,
            "the worker waits on a reader left lingering unseen"
        );
    });
}

/// The check itself: a caller that looks at the worker before it marks
/// the linger (the order reversed) can leave the reader lingering unseen.
#[test]
fn marking_after_looking_is_caught() {
    let found = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let f = found.clone();
    model(move || {
        let g = Group::new(ASLEEP);
        let c = spawn(&g, |g| {
            g.reader.store(LINGERING, Ordering::SeqCst);
            if !g.linger.is_idle() {
                g.reader.store(ASLEEP, Ordering::SeqCst);
            }
            let _ = g.linger.mark();
        });
        let w = spawn(&g, worker);
        if settle(&g, vec![c, w]) == LINGERING {
            f.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    });
    assert!(
        found.load(std::sync::atomic::Ordering::SeqCst),
        "the model never found the lost wake-up of the reversed order"
    );
}
