//! A group's board: one shared-memory area where every rank of a group
//! that lives on one host writes its part of a small op once and reads
//! everyone's (one write and `n − 1` reads per rank, no message per pair).
//! The protocol is `chorus_core::board`; the mapping, the futex and the
//! layout are `shm_board`; the ops that run on it are `algo::run_board`.
//!
//! # Setting it up
//!
//! At the group's first collective (whatever it is, so every rank does it
//! at the same op) in a group of more than 8 ranks (`algo::choose`'s `DIRECT_MAX_RANKS`) with
//! [`TcpOptions::shared_memory`](super::TcpOptions::shared_memory) on,
//! rank 0 creates the board and publishes where it is (`board/at`); every
//! other rank opens it, which works only on the same host, and votes
//! (`board/votes`); the rank that casts the last vote publishes the
//! verdict (`board/verdict`), which every rank reads: the board is used
//! only if every rank opened it. Three store requests per rank, and
//! rank 0 keeps the descriptor open until the verdict.
//!
//! # Waiting
//!
//! A rank waiting for an op's last arrival looks at the `done` word
//! whenever its worker is polled (a spinning caller's rounds poll it).
//! The worker's host task cannot block on the futex, so each board has a
//! **watcher** thread that does: it sleeps on the futex until `done`
//! changes; the worker tells it which op it waits for and hands it its
//! waker. When that op is done, the watcher polls the worker itself
//! (through its relay, as a waiting caller does, see `drive`), so the op
//! completes on the watcher's thread without waking an I/O thread; if
//! someone else polls the worker just then, it wakes the worker instead.
//! The last arriver wakes the futex only when some thread sleeps on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::{Duration, Instant};

use chorus_core::board::{mark, parity, Board};
use chorus_store::Store;

use super::drive;
use super::shm_board::{process_exists, BoardMap, Published};
use super::state::Runner;
use chorus_core::sync::lock;

/// How long the watcher sleeps on the futex at most, before it looks
/// whether its board was dropped and, while the worker waits, whether the
/// ranks that have not arrived still run.
const WATCHER_NAP: Duration = Duration::from_millis(100);

/// What the worker knows of its group's board.
#[derive(Debug, Default)]
pub(super) enum BoardState {
    /// Not set up yet: the group's first collective sets it up.
    #[default]
    Unknown,
    /// No board: its small ops exchange frames.
    Off,
    /// Every rank opened the board.
    On(GroupBoard),
}

/// The worker's handle on its group's board.
#[derive(Debug)]
pub(super) struct GroupBoard {
    shared: Arc<Shared>,
    /// Number of the next board op.
    next: u64,
}

/// What the worker and the watcher share.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) map: BoardMap,
    pub(super) n: usize,
    /// The op the worker waits for, and its waker.
    want: Mutex<Option<(u64, Waker)>>,
    runner: Option<Runner>,
    /// A rank that had not arrived at the op the worker waits for and
    /// whose process is gone, with its process id.
    dead: Mutex<Option<(usize, u32)>>,
    /// The board was dropped: the watcher ends.
    stop: AtomicBool,
}

impl Shared {
    /// The protocol's view of the board.
    pub(super) fn board(&self) -> Board<'_> {
        Board::new(self.map.words(), self.n)
    }

    /// Has the watcher wake `waker` (or run the worker) once op `k` is
    /// done. Call it, then look whether `k` is done already: the watcher
    /// may have looked just before.
    pub(super) fn wake_when_done(&self, k: u64, waker: &Waker) {
        let mut want = lock(&self.want);
        if let Some((wk, w)) = &*want {
            if *wk == k && w.will_wake(waker) {
                return;
            }
        }
        *want = Some((k, waker.clone()));
    }

    /// A rank found dead while the worker waited (see [`dead_peer`]).
    pub(super) fn dead(&self) -> Option<(usize, u32)> {
        *lock(&self.dead)
    }

    /// Op `k` is done (or a rank it waits for is dead): runs the worker
    /// on this thread if no one else polls it now, else wakes it.
    fn serve(&self, k: u64) {
        let woken = {
            let mut want = lock(&self.want);
            match &*want {
                Some((wk, _)) if *wk == k => want.take(),
                _ => None,
            }
        };
        let Some((_, waker)) = woken else {
            return;
        };
        let relay = self
            .runner
            .as_ref()
            .and_then(|r| Some((r.relay.upgrade()?, r)));
        if let Some((relay, r)) = &relay {
            if let Some(claim) = relay.claim() {
                let _rt = r.handle.enter();
                drive::unbudgeted(|| {
                    claim.poll();
                });
                return;
            }
        }
        waker.wake();
    }
}

impl Drop for GroupBoard {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }
}

impl GroupBoard {
    fn new(map: BoardMap, n: usize, runner: Option<Runner>) -> Result<GroupBoard, String> {
        let shared = Arc::new(Shared {
            map,
            n,
            want: Mutex::new(None),
            runner,
            dead: Mutex::new(None),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("chorus-board".into())
            .spawn(move || watch(&s))
            .map_err(|e| format!("cannot start the board's watcher thread: {e}"))?;
        Ok(GroupBoard { shared, next: 0 })
    }

    /// The board, for one op.
    pub(super) fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Takes the number of the next board op.
    pub(super) fn take_next(&mut self) -> u64 {
        let k = self.next;
        self.next += 1;
        k
    }
}

/// The watcher thread of a board (see the module docs): asleep on the
/// futex until `done` changes, then serves the op the worker waits for
/// if it is done; every [`WATCHER_NAP`] the worker has waited, it looks
/// for a rank that has not arrived and whose process is gone.
fn watch(s: &Shared) {
    let board = s.board();
    let mut looked = Instant::now();
    while !s.stop.load(Ordering::SeqCst) {
        let seen = board.sleep();
        let want = lock(&s.want).as_ref().map(|(k, _)| *k);
        match want {
            Some(k) if mark(k) == seen => {
                board.woke();
                s.serve(k);
                looked = Instant::now();
            }
            _ => {
                s.map.wait_done(seen, WATCHER_NAP);
                board.woke();
                let Some(k) = want else {
                    looked = Instant::now();
                    continue;
                };
                if looked.elapsed() < WATCHER_NAP {
                    continue;
                }
                looked = Instant::now();
                if let Some(d) = dead_peer(s, k) {
                    *lock(&s.dead) = Some(d);
                    s.serve(k);
                }
            }
        }
    }
}

/// The first rank that has not arrived at op `k` and whose process is
/// gone, with its process id.
fn dead_peer(s: &Shared, k: u64) -> Option<(usize, u32)> {
    let p = parity(k);
    (0..s.n).find_map(|r| {
        if s.map.stamp(r, p).load(Ordering::Acquire) == k + 1 {
            return None;
        }
        let pid = s.map.pid(r).load(Ordering::Acquire);
        (pid != 0 && !process_exists(pid)).then_some((r, pid))
    })
}

/// Why setting up the board failed (the op fails with it).
#[derive(Debug)]
pub(super) enum SetupFailed {
    /// The store failed: what was asked, and the error.
    Store(String),
    /// Every rank opened the board, but this one cannot use it.
    Other(String),
}

/// Sets up the board of rank `me` of `n` (see the module docs): the
/// board if every rank opened it, `None` if some could not or did not
/// `offer` shared memory (it still votes, against).
pub(super) async fn set_up(
    store: &dyn Store,
    n: usize,
    me: usize,
    offer: bool,
    timeout: Duration,
    runner: Option<Runner>,
) -> Result<Option<GroupBoard>, SetupFailed> {
    let deadline = Instant::now() + timeout;
    let left = || deadline.saturating_duration_since(Instant::now());
    let store_err = |what: &str, e: chorus_store::StoreError| {
        SetupFailed::Store(format!("{what} of the group's shared-memory board: {e}"))
    };
    // Rank 0 keeps the descriptor open until the verdict: peers open it
    // through its process.
    let mut keep_fd = None;
    let opened: Result<BoardMap, String> = if !offer {
        if me == 0 {
            store
                .set("board/at", b"none")
                .await
                .map_err(|e| store_err("publishing the place", e))?;
        }
        Err("shared memory is off on this rank (TcpOptions::shared_memory)".into())
    } else if me == 0 {
        let made = BoardMap::create(n);
        let text = match &made {
            Ok((_, _, p)) => p.to_text(),
            Err(_) => "none".to_string(),
        };
        store
            .set("board/at", text.as_bytes())
            .await
            .map_err(|e| store_err("publishing the place", e))?;
        made.map(|(map, fd, _)| {
            keep_fd = Some(fd);
            map
        })
    } else {
        let raw = store
            .get("board/at", left())
            .await
            .map_err(|e| store_err("reading the place", e))?;
        let text = String::from_utf8_lossy(&raw);
        match Published::parse(&text) {
            Some(p) => BoardMap::open(p, n),
            None => Err(format!("rank 0 published no board ({text:?})")),
        }
    };
    if let Err(e) = &opened {
        tracing::debug!(rank = me, error = %e, "no shared-memory board: its small ops exchange frames");
    }
    // A vote: 1 for "opened", n + 1 for "could not" (so the sum tells
    // both counts).
    let vote = if opened.is_ok() { 1 } else { n as i64 + 1 };
    let sum = store
        .add("board/votes", vote)
        .await
        .map_err(|e| store_err("voting on the use", e))?;
    let (no, yes) = (sum / (n as i64 + 1), sum % (n as i64 + 1));
    if no + yes == n as i64 {
        let verdict: &[u8] = if no == 0 { b"on" } else { b"off" };
        store
            .set("board/verdict", verdict)
            .await
            .map_err(|e| store_err("publishing the verdict on the use", e))?;
    }
    let verdict = store
        .get("board/verdict", left())
        .await
        .map_err(|e| store_err("reading the verdict on the use", e))?;
    drop(keep_fd);
    match (verdict.as_slice(), opened) {
        (b"on", Ok(map)) => {
            map.pid(me).store(std::process::id(), Ordering::Release);
            GroupBoard::new(map, n, runner)
                .map(Some)
                .map_err(SetupFailed::Other)
        }
        _ => Ok(None),
    }
}
