//! What the TCP backend's handle, its worker and its reader tasks share:
//! the group's failure, each peer's connection state, the receive pool,
//! the way to run the worker from another thread.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use chorus_core::relay::Relay;
use chorus_core::{OpContext, WorkError};
use tokio::runtime::Handle;
use tokio::sync::watch;

use super::options::TcpOptions;
use super::pool::Pool;
use super::wire::{at_seq, mismatch_detail, op_name, Sig, OWN_SEQ};
use chorus_core::sync::lock;

/// How a peer's connection ended.
#[derive(Clone, Debug)]
pub(super) enum PeerState {
    /// Not connected yet: no op needed the peer so far.
    Unconnected,
    /// Connected.
    Open,
    /// The peer said goodbye: its backend was dropped after finishing its
    /// ops. Frames already received can still be used.
    Departed,
    /// The connection broke (EOF without goodbye, reset, corrupt stream).
    Lost(String),
    /// The link went silent for the liveness timeout (the kernel gave up
    /// on it: `ETIMEDOUT`).
    Silent(Duration),
    /// The peer's group failed, and its last frame said why (a fault
    /// notice): the failure as this rank sees it.
    Failed(WorkError),
}

impl PeerState {
    /// Still connected.
    pub(super) fn is_open(&self) -> bool {
        matches!(self, PeerState::Open)
    }

    /// How the connection to `peer` ended, as the error of the op `ctx`
    /// that needed it.
    pub(super) fn error(&self, ctx: &OpContext, peer: usize) -> WorkError {
        let cause = match self {
            PeerState::Silent(after) => {
                return WorkError::PeerSilent {
                    ctx: ctx.clone(),
                    peer,
                    after: *after,
                }
            }
            PeerState::Failed(e) => return e.for_op(ctx.clone()),
            // A goodbye: the peer left, it did not die.
            PeerState::Departed => {
                return WorkError::PeerLeft {
                    ctx: ctx.clone(),
                    peer,
                }
            }
            PeerState::Lost(c) => c.clone(),
            PeerState::Open => "the connection's queue closed".to_string(),
            PeerState::Unconnected => "this rank has no connection to it".to_string(),
        };
        WorkError::PeerLost {
            ctx: ctx.clone(),
            peer,
            cause,
        }
    }
}

/// State shared by the backend handle, its worker and its reader tasks.
pub(super) struct Inner {
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) group: Arc<str>,
    pub(super) group_hash: u32,
    pub(super) opts: TcpOptions,
    pub(super) pool: Arc<Pool>,
    /// The first failure; later ops fail with it.
    pub(super) failed: Mutex<Option<WorkError>>,
    pub(super) has_failed: AtomicBool,
    /// Set to true on failure or abort: stops the worker's current op.
    pub(super) stop: watch::Sender<bool>,
    /// The first peer whose connection broke, and why. Frames that already
    /// arrived from it are still used (a rank that lags behind finishes the
    /// ops its peers completed before one of them failed, and a mismatch
    /// found in a received header is reported as such, not as the close
    /// that followed it); an op that needs more from it fails at once.
    pub(super) lost: Mutex<Option<(usize, PeerState)>>,
    pub(super) peers: Mutex<Vec<PeerState>>,
    /// Each connected peer's reader (ended by `stop_readers`).
    pub(super) readers: Mutex<Vec<Arc<Relay>>>,
    /// Whether the worker waits for its next op (its queue is empty), and
    /// whether a caller left pipes watched after its op (see `linger`).
    pub(super) linger: chorus_core::linger::Linger,
    /// Starts the sweep of lingering pipes.
    pub(super) linger_start: tokio::sync::Notify,
    /// Ops the worker took so far (the sweep tells an op nobody polls).
    pub(super) taken: AtomicU64,
    /// Frames the worker sent or received so far: a caller that drives an
    /// op keeps at it while they move (see `drive`).
    pub(super) moved: AtomicU64,
    /// The smallest op buffer whose final bytes are written with
    /// streaming stores (see `shm::stream_from`).
    pub(super) stream_from: usize,
    /// Frames sent through shared memory.
    pub(super) shm_frames: AtomicU64,
    /// Doorbells rung on this rank's pipes (see `pipe_io`).
    pub(super) doorbells: Arc<AtomicU64>,
    /// Frames that could have gone through shared memory but found every
    /// slot in use (sent through the socket).
    pub(super) shm_full: AtomicU64,
    /// Every op's signature is checked against every rank's before its
    /// result is taken (the checked mode; the same on every rank).
    pub(super) checked: bool,
    /// How far the worker got, for frames that arrive after it finished
    /// the op they belong to (see [`Progress`]).
    pub(super) progress: Progress,
    /// The worker's relay, for the board's watcher to run it (set once
    /// the worker is made; see `board`).
    pub(super) runner: std::sync::OnceLock<Runner>,
    /// Tests: the backend fails without telling its peers, as a process
    /// that dies does.
    #[cfg(test)]
    pub(super) mute: AtomicBool,
}

/// How the watcher runs the group's worker itself once the op it waits
/// for is done: the worker's relay, polled on the watcher's thread as a
/// waiting caller polls it (`drive`), which saves waking an I/O thread.
#[derive(Debug, Clone)]
pub(super) struct Runner {
    pub(super) relay: Weak<Relay>,
    pub(super) handle: Handle,
}

/// The collectives this rank's worker has finished, so that a frame that
/// comes for one of them — which no op will ever read, as every op reads
/// all the frames it expects before it finishes — is known for what it is:
/// its sender called a different op at that seq (a root this rank did not
/// take for one, say). The worker looks through the queues for such frames
/// when it finishes an op, and checks every frame it takes, so a rank that
/// finished an op its peers called differently fails at its next op at the
/// latest. Readers use it to tell whether this rank reached the op at
/// which a peer's group failed ([`Inner::peer_failed`]).
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// The last program collective finished (its seq).
    done: AtomicU64,
    /// The last of chorus's own collectives finished (its number).
    done_own: AtomicU64,
    /// The signatures of the last collectives this rank ran, newest last,
    /// with their names, to describe a late frame against.
    recent: Mutex<VecDeque<(Sig, &'static str)>>,
    /// A peer's failure at a seq this rank has not reached yet: a rank
    /// that lags behind still finishes the ops its peers finished, and
    /// fails at that seq (see [`Inner::peer_failed`]).
    ahead: Mutex<Option<(u64, WorkError)>>,
}

/// How many finished collectives [`Progress`] remembers.
const RECENT: usize = 64;

/// Whether wire seq `a` comes at or before `b` in the same sequence (the
/// program's, or chorus's own; seqs of different sequences never compare).
fn same_seq_at_or_before(a: u64, done: u64, done_own: u64) -> bool {
    if a & OWN_SEQ != 0 {
        a & !OWN_SEQ <= done_own
    } else {
        a <= done
    }
}

impl Progress {
    /// Records that the collective `sig` (named `name`) finished here.
    /// The fence pairs with the one a reader makes after it noted a peer's
    /// failure ahead ([`Inner::peer_failed`]): one of the two sees the
    /// other.
    pub(super) fn finished(&self, sig: Sig, name: &'static str) {
        {
            let mut r = lock(&self.recent);
            if r.len() == RECENT {
                r.pop_front();
            }
            r.push_back((sig, name));
        }
        if sig.seq & OWN_SEQ != 0 {
            self.done_own.store(sig.seq & !OWN_SEQ, Ordering::SeqCst);
        } else {
            self.done.store(sig.seq, Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
    }

    /// Whether a collective frame of wire seq `seq`, taken by the worker,
    /// belongs to an op this rank has finished.
    pub(super) fn is_late(&self, seq: u64) -> bool {
        seq != 0
            && same_seq_at_or_before(
                seq,
                self.done.load(Ordering::SeqCst),
                self.done_own.load(Ordering::SeqCst),
            )
    }

    /// The mismatch a late frame `theirs` from `peer` shows, as the error
    /// of the op `ctx` of this rank `me`.
    pub(super) fn late_mismatch(
        &self,
        ctx: OpContext,
        me: usize,
        peer: usize,
        theirs: &Sig,
    ) -> WorkError {
        let ours = lock(&self.recent)
            .iter()
            .rev()
            .find(|(s, _)| s.seq == theirs.seq)
            .copied();
        let detail = match ours {
            Some((ours, name)) => {
                let mut d = mismatch_detail(peer, theirs, me, &ours, name);
                d.push_str(&format!(
                    "; rank {me} had finished that op without a frame from rank {peer} when this one came"
                ));
                d
            }
            None => format!(
                "rank {peer} {} called {} but rank {me} had finished that op long before, without a frame from rank {peer}",
                at_seq(theirs.seq),
                theirs.describe(op_name(theirs.op), theirs),
            ),
        };
        WorkError::Mismatch { ctx, detail }
    }
}

/// How long an op that needs a peer whose connection broke without a word
/// waits for another rank's fault notice to name the cause.
const NOTICE_GRACE: Duration = Duration::from_millis(50);

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpBackend")
            .field("group", &self.group)
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("failed", &self.has_failed.load(Ordering::Relaxed))
            .finish()
    }
}

impl Inner {
    /// Context for failures that belong to no particular op (a peer lost
    /// between ops); re-addressed with `for_op` when an op fails with it.
    pub(super) fn base_ctx(&self) -> OpContext {
        OpContext {
            rank: self.rank,
            group: self.group.clone(),
            seq: 0,
            op: "tcp",
            internal: None,
        }
    }

    pub(super) fn failure(&self) -> Option<WorkError> {
        if !self.has_failed.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.failed).clone()
    }

    /// Marks the backend failed with `cause` (the first cause wins) and stops
    /// the worker's current op.
    pub(super) fn fail(&self, cause: &WorkError) {
        {
            let mut f = lock(&self.failed);
            if f.is_none() {
                tracing::debug!(group = %self.group, rank = self.rank, error = %cause, "TCP backend failed");
                *f = Some(cause.clone());
            }
            self.has_failed.store(true, Ordering::Release);
        }
        self.stop.send_replace(true);
    }

    /// True while some peer's connection is open (no goodbye, not lost).
    pub(super) fn any_peer_open(&self) -> bool {
        let peers = lock(&self.peers);
        peers
            .iter()
            .enumerate()
            .any(|(p, st)| p != self.rank && st.is_open())
    }

    /// A connection to `peer` was made (its reader is about to start).
    pub(super) fn peer_connected(&self, peer: usize) {
        let mut peers = lock(&self.peers);
        if let Some(p @ PeerState::Unconnected) = peers.get_mut(peer) {
            *p = PeerState::Open;
        }
    }

    /// Called by a reader task when its connection ends.
    pub(super) fn peer_ended(&self, peer: usize, end: PeerState) {
        {
            let mut peers = lock(&self.peers);
            if let Some(p) = peers.get_mut(peer) {
                if p.is_open() {
                    *p = end.clone();
                }
            }
        }
        // The worker is not stopped here: frames this peer sent before its
        // connection ended are still queued and may be all the op in flight
        // needs (a peer that finished the op and exited). An op that needs
        // more from this peer finds its queue closed and fails at once with
        // `PeerLost`; ops that need nothing more from it may finish.
        if matches!(end, PeerState::Lost(_) | PeerState::Silent(_)) {
            lock(&self.lost).get_or_insert((peer, end));
        }
    }

    /// Called by a reader whose peer's last frame said its group failed
    /// at wire seq `seq` with `cause` (as this rank sees it): ops that need
    /// the peer fail with the cause, not with the close that follows, and
    /// the group fails now if this rank has reached that seq, else when it
    /// does (it may still finish the ops before it, as its peers did).
    pub(super) fn peer_failed(&self, peer: usize, seq: u64, cause: WorkError) {
        {
            let mut peers = lock(&self.peers);
            if let Some(p) = peers.get_mut(peer) {
                if p.is_open() {
                    *p = PeerState::Failed(cause.clone());
                }
            }
        }
        let p = &self.progress;
        let reached = |seq: u64| {
            seq == 0 || seq & OWN_SEQ != 0 || seq <= p.done.load(Ordering::SeqCst).saturating_add(1)
        };
        if reached(seq) {
            self.fail(&cause);
            return;
        }
        lock(&p.ahead).get_or_insert((seq, cause.clone()));
        fence(Ordering::SeqCst);
        // The worker may have moved on meanwhile (it checks `ahead` after
        // each op it finishes).
        if reached(seq) {
            self.fail(&cause);
        }
    }

    /// After the op at program seq `seq` finished: a peer's failure that
    /// this rank has now reached, if any (see [`peer_failed`](Self::peer_failed)).
    pub(super) fn reached_peer_failure(&self, seq: u64) -> Option<WorkError> {
        fence(Ordering::SeqCst);
        let ahead = lock(&self.progress.ahead);
        match &*ahead {
            Some((at, cause)) if seq.saturating_add(1) >= *at => Some(cause.clone()),
            _ => None,
        }
    }

    /// The group's failure once the worker was stopped: the recorded
    /// failure, else the lost peer (which becomes the failure).
    pub(super) fn settle(&self) -> WorkError {
        if let Some(f) = self.failure() {
            return f;
        }
        let lost = lock(&self.lost).clone();
        let e = match lost {
            Some((peer, end)) => end.error(&self.base_ctx(), peer),
            None => WorkError::Aborted {
                ctx: self.base_ctx(),
                reason: "the TCP backend was stopped".into(),
            },
        };
        self.fail(&e);
        self.failure().unwrap_or(e)
    }

    pub(super) fn peer_state(&self, peer: usize) -> PeerState {
        lock(&self.peers)
            .get(peer)
            .cloned()
            .unwrap_or(PeerState::Open)
    }

    /// The error for an op that needs `peer` after its connection ended:
    /// the group's failure if it has one (a failed or aborted group ends
    /// its readers itself, and the cause is the failure, not the close),
    /// else how the connection ended. A peer that closed without a word
    /// most often closed because another rank failed first: the fault
    /// notices of the others, which name the cause, get a moment (at most
    /// [`NOTICE_GRACE`]) to arrive.
    pub(super) async fn lost_error(&self, ctx: &OpContext, peer: usize) -> WorkError {
        let start = tokio::time::Instant::now();
        loop {
            if let Some(cause) = self.failure() {
                return cause.for_op(ctx.clone());
            }
            let state = self.peer_state(peer);
            if !matches!(state, PeerState::Lost(_)) || start.elapsed() >= NOTICE_GRACE {
                return state.error(ctx, peer);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Ends every reader.
    pub(super) fn stop_readers(&self) {
        let readers = std::mem::take(&mut *lock(&self.readers));
        for r in readers {
            r.cancel();
        }
    }
}
