//! The per-group worker: runs ops one at a time in submission order, sends
//! and receives the frames of each op and checks every header it receives.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chorus_core::{HostBuffer, Op, OpContext, WorkError};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;
use tracing::Instrument;

use super::board::BoardState;
use super::conn::{Frame, Incoming, Lent, Link, Payload, Writer};
use super::dialer::Dialer;
use super::install::Installed;
use super::notice::Notice;
use super::request::OpRequest;
use super::shm;
use super::state::{Inner, PeerState};
use super::wire::{
    mismatch_detail, op_name, wire_seq, Header, Sig, CLASS_BYE, CLASS_FAULT, CLASS_P2P, NONE32,
    NONE8,
};

/// What [`Worker::take`] got.
enum Got {
    Frame(Frame),
    Lent(Lent),
}

/// One running op, as the frame helpers see it.
#[derive(Debug)]
pub(super) struct Active<'a> {
    pub(super) ctx: &'a OpContext,
    pub(super) sig: Sig,
    pub(super) class: u8,
}

/// The worker's shared-memory state.
#[derive(Debug)]
pub(super) struct Shm {
    /// Segment to each peer, if any.
    pub(super) tx: Vec<Option<shm::Tx>>,
    /// This rank's broadcast segment, if any.
    pub(super) bcast: Option<shm::Tx>,
    /// Whether each peer mapped the broadcast segment.
    pub(super) bcast_ok: Vec<bool>,
    /// Every rank is on this host and offers shared memory (the same on
    /// every rank), once found out (see `dialer`).
    pub(super) all_local: Option<bool>,
}

/// The worker task's state. It alone writes to the connections.
#[derive(Debug)]
pub(super) struct Worker {
    pub(super) inner: Arc<Inner>,
    /// Opens connections when an op first needs them.
    pub(super) dialer: Dialer,
    /// Each connected peer's write side.
    writers: Vec<Option<Writer>>,
    /// Shared-memory segments.
    pub(super) shm: Shm,
    pub(super) coll: Vec<Option<UnboundedReceiver<Incoming>>>,
    p2p: Vec<Option<UnboundedReceiver<Frame>>>,
    /// Each peer's [`Link`], once its reader sent it.
    pub(super) links: Vec<Option<Arc<Link>>>,
    /// Collective frames taken out of a queue ahead of time (read ahead
    /// from a lent read side, or looked at while waiting on another peer),
    /// before what is still in the queue.
    pub(super) stash: Vec<VecDeque<Frame>>,
    /// The group's shared-memory board, once set up (see `board`).
    pub(super) board: BoardState,
    /// Frames sent to / received from each peer in the current op.
    sent: Vec<u32>,
    recvd: Vec<u32>,
}

/// Waits (at most 2 s) until every peer has said goodbye or gone, so that
/// this rank does not close while a peer still reads what it sent (a socket
/// closed with unread data resets the connection).
async fn await_goodbyes(inner: &Inner) {
    let all_gone = async {
        while inner.any_peer_open() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), all_gone).await;
}

/// How long a failed rank spends connecting to the peers it never talked
/// to, to tell them why it failed.
const NOTICE_CONNECT: Duration = Duration::from_secs(2);

async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The sender lives in `Inner`, which the worker holds: `wait_for` only
    // returns once the flag is set.
    let _ = stop.wait_for(|s| *s).await;
}

/// What every rank must agree on of collective `op` at `ctx` on `bufs`
/// (its frames' algorithm aside): see [`Sig`].
pub(super) fn signature(ctx: &OpContext, op: Op, bufs: &[HostBuffer]) -> Sig {
    let first = bufs.first();
    let (redop, root) = match op {
        Op::AllReduce(r) | Op::ReduceScatter(r) => (Some(r), None),
        Op::Reduce { root, op } => (Some(op), Some(root)),
        Op::Broadcast { root } => (None, Some(root)),
        _ => (None, None),
    };
    let count = match op {
        Op::ReduceScatter(_) => bufs.get(1).map_or(0, HostBuffer::len),
        Op::Barrier => 0,
        _ => first.map_or(0, HostBuffer::len),
    };
    Sig {
        seq: wire_seq(ctx),
        op: super::wire::op_code(ctx.op),
        dtype: first.map_or(NONE8, |b| b.dtype() as u8),
        redop: redop.map_or(NONE8, |r| r as u8),
        root: root.map_or(NONE32, |r| r as u32),
        count: count as u64,
        algo: 0,
    }
}

/// Bytes an op moves from this rank's point of view (for traces): its
/// output's for all_gather and all_to_all, its first buffer's otherwise.
fn op_bytes(op: Op, bufs: &[HostBuffer]) -> usize {
    let i = usize::from(matches!(op, Op::AllGather | Op::AllToAll));
    bufs.get(i).map_or(0, |b| b.as_bytes().len())
}

impl Worker {
    /// A worker with no connection yet; `bcast`: this rank's broadcast
    /// segment, if it has one.
    pub(super) fn new(inner: Arc<Inner>, dialer: Dialer, bcast: Option<shm::Tx>) -> Worker {
        let n = inner.size;
        Worker {
            inner,
            dialer,
            writers: (0..n).map(|_| None).collect(),
            shm: Shm {
                tx: (0..n).map(|_| None).collect(),
                bcast,
                bcast_ok: vec![false; n],
                all_local: None,
            },
            coll: (0..n).map(|_| None).collect(),
            p2p: (0..n).map(|_| None).collect(),
            links: vec![None; n],
            stash: (0..n).map(|_| VecDeque::new()).collect(),
            board: BoardState::Unknown,
            sent: vec![0; n],
            recvd: vec![0; n],
        }
    }

    /// Whether this worker holds a connection to `peer`.
    pub(super) fn is_connected(&self, peer: usize) -> bool {
        self.writers.get(peer).is_some_and(Option::is_some)
    }

    /// Takes the connection `i` to `peer` into use.
    pub(super) fn adopt(&mut self, peer: usize, i: Installed) {
        self.writers[peer] = Some(i.writer);
        self.coll[peer] = Some(i.coll);
        self.p2p[peer] = Some(i.p2p);
        self.shm.tx[peer] = i.shm_tx;
        self.shm.bcast_ok[peer] = i.bcast_ok;
    }

    /// Takes into use every connection peers made that no op needed yet.
    pub(super) fn adopt_arrived(&mut self) {
        for (p, i) in self.dialer.links.take_arrived() {
            self.adopt(p, *i);
        }
    }

    /// Runs ops until the backend is dropped (then says goodbye to every
    /// peer) or fails (then fails the queue); closes every connection.
    pub(super) async fn run(
        mut self,
        mut rx: UnboundedReceiver<OpRequest>,
        mut stop: watch::Receiver<bool>,
        mut close: watch::Receiver<bool>,
    ) {
        let inner = self.inner.clone();
        // One timer for every op, moved to each op's deadline. A deadline
        // later than the timer's current one only updates the entry; a
        // fresh `tokio::time::timeout` per op would register a timer and
        // wake the runtime's parked thread for every op.
        let timer = tokio::time::sleep(Duration::from_secs(3600));
        tokio::pin!(timer);
        let graceful = loop {
            // Idle when nothing is queued: a small op submitted now may be
            // started on its caller's thread (see `drive`).
            inner.linger.set_idle(rx.is_empty());
            let next = tokio::select! {
                biased;
                () = stopped(&mut stop) => None,
                r = rx.recv() => Some(r),
                () = stopped(&mut close) => Some(None),
            };
            inner.linger.set_idle(false);
            let req = match next {
                None => break false,
                Some(None) => break true,
                Some(Some(req)) => req,
            };
            inner.taken.fetch_add(1, Ordering::SeqCst);
            let OpRequest {
                ctx,
                op,
                mut bufs,
                timeout,
                completer,
            } = req;
            if let Some(cause) = inner.failure() {
                completer.fail(cause.for_op(ctx), bufs);
                break false;
            }
            completer.started();
            let span = tracing::debug_span!(
                "tcp_op",
                group = %ctx.group,
                rank = ctx.rank,
                seq = ctx.seq,
                op = ctx.op,
                bytes = op_bytes(op, &bufs)
            );
            let now = tokio::time::Instant::now();
            let deadline = now
                .checked_add(timeout)
                .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 86_400));
            timer.as_mut().reset(deadline);
            let res = async {
                tokio::select! {
                    // The op first: frames that already arrived (a peer's
                    // mismatching header) are looked at before a stop caused by
                    // that peer closing its connection.
                    biased;
                    r = self.execute(&ctx, op, &mut bufs) => r,
                    () = &mut timer => Err(WorkError::OpTimeout { ctx: ctx.clone(), after: timeout }),
                    () = stopped(&mut stop) => Err(inner.settle().for_op(ctx.clone())),
                }
            }
            .instrument(span)
            .await;
            // A finished collective: frames for it that no op read show a
            // peer that called something else.
            let res = match res {
                Ok(()) if op.is_collective() => self.finished(&ctx, op, &bufs).await,
                other => other,
            };
            match res {
                Ok(()) => {
                    completer.complete(Ok(bufs));
                    // A peer's group failed at the next seq: so does this
                    // rank's, now that it got there.
                    if let Some(cause) = inner.reached_peer_failure(ctx.seq) {
                        inner.fail(&cause);
                    }
                }
                Err(e) => {
                    tracing::debug!(op = %ctx, error = %e, "op failed");
                    inner.fail(&e);
                    // The op's future is gone: no socket touches the buffers
                    // any more, and they go back with the error.
                    completer.fail(e, bufs);
                    break false;
                }
            }
        };
        // Fail what is queued, and refuse what comes later (`submit` sees the
        // closed queue or the failure).
        let cause = if graceful { None } else { Some(inner.settle()) };
        rx.close();
        while let Some(req) = rx.recv().await {
            let err = match &cause {
                Some(cause) => cause.for_op(req.ctx.clone()),
                None => WorkError::Backend {
                    ctx: req.ctx.clone(),
                    msg: "the TCP backend shut down".into(),
                },
            };
            req.completer.fail(err, req.bufs);
        }
        match &cause {
            None => {
                self.say_goodbye().await;
                await_goodbyes(&inner).await;
            }
            Some(cause) => self.tell_peers(cause).await,
        }
        // Closing the write halves sends FIN; aborting the readers drops the
        // read halves, which closes the sockets.
        self.writers.clear();
        self.dialer.stop();
        inner.stop_readers();
        tracing::debug!(group = %inner.group, rank = inner.rank, graceful, "TCP worker stopped");
    }

    async fn say_goodbye(&mut self) {
        let hdr = Header {
            group: self.inner.group_hash,
            class: CLASS_BYE,
            sig: Sig {
                seq: 0,
                op: NONE8,
                dtype: NONE8,
                redop: NONE8,
                root: NONE32,
                count: 0,
                algo: 0,
            },
            frame: 0,
            len: 0,
            shm: 0,
        }
        .encode();
        // Best effort: peers that are gone or stuck hold us up for one
        // second at most, all together.
        let all = async {
            for w in self.writers.iter_mut().flatten() {
                let _ = w.write_frame(&hdr, &[]).await;
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), all).await;
    }

    /// Tells every peer still connected why this rank's group failed (a
    /// fault notice, the connection's last frame), so that it fails with
    /// the cause rather than with the close that follows. Best effort,
    /// bounded like the goodbyes; a connection cut in the middle of a frame
    /// gets nothing.
    async fn tell_peers(&mut self, cause: &WorkError) {
        #[cfg(test)]
        if self.inner.mute.load(Ordering::SeqCst) {
            return;
        }
        // Peers this rank never talked to learn of a mismatch it found
        // too (a peer may be about to wait on this rank, and nothing else
        // would tell it why). Other faults are the peers' to find
        // (liveness, their own connections), and dialling peers across a
        // partition would hold this rank up while the group re-forms.
        if matches!(cause, WorkError::Mismatch { .. }) {
            self.ensure_all(std::time::Instant::now() + NOTICE_CONNECT)
                .await;
        }
        let body = Notice::of(cause).encode();
        let hdr = Header {
            group: self.inner.group_hash,
            class: CLASS_FAULT,
            sig: Sig {
                seq: wire_seq(cause.context()),
                op: NONE8,
                dtype: NONE8,
                redop: NONE8,
                root: NONE32,
                count: 0,
                algo: 0,
            },
            frame: 0,
            len: body.len() as u64,
            shm: 0,
        }
        .encode();
        let inner = self.inner.clone();
        let all = async {
            for (peer, w) in self.writers.iter_mut().enumerate() {
                let Some(w) = w.as_mut().filter(|w| w.whole()) else {
                    continue;
                };
                if inner.peer_state(peer).is_open() {
                    let _ = w.write_frame(&hdr, &body).await;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_millis(500), all).await;
    }

    /// After collective `op` at `ctx` ran to its end on `bufs`: records it
    /// as finished, then looks through every peer's frames not yet taken
    /// for one of it (or of an op before it), which no op will read: its
    /// sender called something else (see `state::Progress`).
    async fn finished(
        &mut self,
        ctx: &OpContext,
        op: Op,
        bufs: &[HostBuffer],
    ) -> Result<(), WorkError> {
        let sig = signature(ctx, op, bufs);
        self.inner.progress.finished(sig, ctx.op);
        self.adopt_arrived();
        for peer in 0..self.n() {
            let late = |f: &Frame| self.inner.progress.is_late(f.hdr.sig.seq);
            if let Some(f) = self.stash[peer].iter().find(|f| late(f)) {
                let theirs = f.hdr.sig;
                return Err(self.late_error(ctx, peer, &theirs));
            }
            while let Some(q) = self.coll.get_mut(peer).and_then(Option::as_mut) {
                let f = match q.try_recv() {
                    Ok(Incoming::Frame(f)) => f,
                    Ok(Incoming::Lent(l)) => {
                        let o = Active {
                            ctx,
                            sig,
                            class: super::wire::CLASS_COLL,
                        };
                        self.absorb(&o, peer, l).await?
                    }
                    Ok(Incoming::Link(l)) => {
                        self.links[peer] = Some(l);
                        continue;
                    }
                    Err(_) => break,
                };
                if self.inner.progress.is_late(f.hdr.sig.seq) {
                    let theirs = f.hdr.sig;
                    return Err(self.late_error(ctx, peer, &theirs));
                }
                self.stash[peer].push_back(f);
            }
        }
        Ok(())
    }

    /// The mismatch a frame `theirs` from `peer` shows that came for an
    /// op this rank finished, as the error of the op at `ctx`.
    fn late_error(&self, ctx: &OpContext, peer: usize, theirs: &Sig) -> WorkError {
        self.inner
            .progress
            .late_mismatch(ctx.clone(), self.me(), peer, theirs)
    }

    pub(super) fn n(&self) -> usize {
        self.inner.size
    }

    pub(super) fn me(&self) -> usize {
        self.inner.rank
    }

    /// Resets the per-op frame counters.
    pub(super) fn begin(&mut self) {
        self.sent.fill(0);
        self.recvd.fill(0);
    }

    /// Sends one frame of `op` to `peer`.
    pub(super) async fn send(
        &mut self,
        op: &Active<'_>,
        peer: usize,
        payload: &[u8],
    ) -> Result<(), WorkError> {
        // A large payload to a peer with shared memory goes into a free
        // slot, and only the header through the socket; with every slot in
        // use it goes through the socket.
        if payload.len() >= shm::SHM_MIN {
            if let Some(tx) = self.shm.tx.get_mut(peer).and_then(Option::as_mut) {
                match tx.try_put(payload) {
                    Some(i) => {
                        self.inner.shm_frames.fetch_add(1, Ordering::Relaxed);
                        return self.write(op, peer, payload.len(), i + 1, &[]).await;
                    }
                    None => {
                        self.inner.shm_full.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        self.write(op, peer, payload.len(), 0, payload).await
    }

    /// Sends one frame of `op` with `payload` to every other rank: written
    /// once into a slot of this rank's broadcast segment when it is large
    /// and there is one free (each peer that mapped the segment gets only
    /// the header), else to each peer with [`Worker::send`].
    pub(super) async fn send_to_all(
        &mut self,
        op: &Active<'_>,
        payload: &[u8],
    ) -> Result<(), WorkError> {
        let others: Vec<usize> = self.others().collect();
        for &p in &others {
            self.ensure(op.ctx, p).await?;
        }
        let readers = others.iter().filter(|&&p| self.shm.bcast_ok[p]).count();
        let mut slot = None;
        if payload.len() >= shm::SHM_MIN && readers > 0 {
            if let Some(tx) = self.shm.bcast.as_mut() {
                match tx.reserve(payload.len()) {
                    Some(r) => {
                        tx.slot_mut(&r).copy_from_slice(payload);
                        slot = Some(tx.publish_for(r, readers as u32));
                    }
                    None => {
                        self.inner.shm_full.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        for p in others {
            match slot {
                Some(i) if self.shm.bcast_ok[p] => {
                    self.inner.shm_frames.fetch_add(1, Ordering::Relaxed);
                    self.write(op, p, payload.len(), shm::BCAST_BIT | (i + 1), &[])
                        .await?
                }
                _ => self.send(op, p, payload).await?,
            }
        }
        Ok(())
    }

    /// A shared-memory slot to `peer` for a payload of `len` bytes, to be
    /// filled in place (through [`Worker::slot_mut`]) and sent with
    /// [`Worker::send_reserved`]; `None` when the payload is small, `peer`
    /// has no shared memory or every slot is in use.
    pub(super) fn reserve(&mut self, peer: usize, len: usize) -> Option<shm::Reserved> {
        if len < shm::SHM_MIN {
            return None;
        }
        let r = self.shm.tx.get_mut(peer)?.as_mut()?.reserve(len);
        if r.is_none() {
            self.inner.shm_full.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// The bytes of a slot reserved for `peer`.
    pub(super) fn slot_mut(&mut self, peer: usize, r: &shm::Reserved) -> &mut [u8] {
        match self.shm.tx.get_mut(peer).and_then(Option::as_mut) {
            Some(tx) => tx.slot_mut(r),
            // `reserve` only hands out slots of existing segments.
            None => &mut [],
        }
    }

    /// Sends a frame of `op` whose payload was written into a slot reserved
    /// for `peer`.
    pub(super) async fn send_reserved(
        &mut self,
        op: &Active<'_>,
        peer: usize,
        r: shm::Reserved,
    ) -> Result<(), WorkError> {
        let len = r.len();
        let Some(tx) = self.shm.tx.get_mut(peer).and_then(Option::as_mut) else {
            return Err(WorkError::Backend {
                ctx: op.ctx.clone(),
                msg: format!("no shared memory to rank {peer}"),
            });
        };
        let i = tx.publish(r);
        self.inner.shm_frames.fetch_add(1, Ordering::Relaxed);
        self.write(op, peer, len, i + 1, &[]).await
    }

    /// Writes one frame header (`len` payload bytes, shared-memory slot
    /// field `slot`) and `body` to `peer`.
    async fn write(
        &mut self,
        op: &Active<'_>,
        peer: usize,
        len: usize,
        slot: u16,
        body: &[u8],
    ) -> Result<(), WorkError> {
        self.ensure(op.ctx, peer).await?;
        let frame = self.sent[peer];
        self.sent[peer] = frame.wrapping_add(1);
        self.inner.moved.fetch_add(1, Ordering::Relaxed);
        if !self.inner.peer_state(peer).is_open() {
            // The peer may have closed because it found a mismatch in an
            // earlier frame of this op: that is the better report.
            return Err(self.close_cause(op, peer).await);
        }
        let hdr = Header {
            group: self.inner.group_hash,
            class: op.class,
            sig: op.sig,
            frame,
            len: len as u64,
            shm: slot,
        }
        .encode();
        let Some(w) = self.writers.get_mut(peer).and_then(Option::as_mut) else {
            return Err(WorkError::Backend {
                ctx: op.ctx.clone(),
                msg: format!("no connection to rank {peer}"),
            });
        };
        let live = self.inner.opts.liveness_timeout;
        let Err(e) = w.write_frame(&hdr, body).await else {
            return Ok(());
        };
        // Unacknowledged data past TCP_USER_TIMEOUT: the link is silent.
        if e.kind() == std::io::ErrorKind::TimedOut && !live.is_zero() {
            return Err(WorkError::PeerSilent {
                ctx: op.ctx.clone(),
                peer,
                after: live,
            });
        }
        // A peer that found a mismatch closes at once, possibly while this
        // rank still writes: what it sent before, or its fault notice, is
        // the better report.
        match self.close_cause(op, peer).await {
            e @ (WorkError::Mismatch { .. } | WorkError::Remote { .. }) => Err(e),
            e => Err(match self.inner.failure() {
                Some(cause) => cause.for_op(op.ctx.clone()),
                None if matches!(e, WorkError::PeerLost { .. }) => WorkError::PeerLost {
                    ctx: op.ctx.clone(),
                    peer,
                    cause: format!("write failed: {e}"),
                },
                None => e,
            }),
        }
    }

    /// Why `peer` closed or a write to it failed, as the error of `op`:
    /// the mismatch its frame for this op shows, if the frame arrived
    /// before the connection ended (its reader delivers what came before
    /// the end, then closes the queue; waited for at most 200 ms), else
    /// the group's failure or how the peer ended (its fault notice, if it
    /// sent one).
    async fn close_cause(&mut self, op: &Active<'_>, peer: usize) -> WorkError {
        if op.class == CLASS_P2P {
            return self.inner.lost_error(op.ctx, peer).await;
        }
        // What the peer sent before the end: a frame of this op that
        // mismatches, or the end itself (its fault notice, if it sent one).
        let until = tokio::time::Instant::now() + Duration::from_millis(200);
        loop {
            match tokio::time::timeout_at(until, self.take(op, peer, false)).await {
                Ok(Ok(got)) => {
                    let hdr = match got {
                        Got::Frame(f) => f.hdr,
                        Got::Lent(l) => l.hdr,
                    };
                    // Only the op's identity: frame index and length are
                    // this op's own.
                    if let Err(e @ WorkError::Mismatch { .. }) =
                        self.check(op, peer, &hdr, hdr.frame, hdr.len as usize)
                    {
                        return e;
                    }
                }
                Ok(Err(e)) => return e,
                Err(_) => return self.inner.lost_error(op.ctx, peer).await,
            }
        }
    }

    /// Receives the next frame of `op` from `peer` and checks its header;
    /// the payload must be `len` bytes.
    pub(super) async fn recv(
        &mut self,
        op: &Active<'_>,
        peer: usize,
        len: usize,
    ) -> Result<Frame, WorkError> {
        let idx = self.recvd[peer];
        self.recvd[peer] = idx.wrapping_add(1);
        let got = self.take(op, peer, false).await?;
        self.inner.moved.fetch_add(1, Ordering::Relaxed);
        let f = match got {
            Got::Frame(f) => f,
            Got::Lent(l) => self.absorb(op, peer, l).await?,
        };
        self.check(op, peer, &f.hdr, idx, len)?;
        Ok(f)
    }

    /// Receives the next frame of collective `op` from `peer`, checks its
    /// header and puts its payload, which must be `dst.len()` bytes, into
    /// `dst`. When the frame has not arrived yet, a large payload is read
    /// from the socket straight into `dst`.
    pub(super) async fn recv_into(
        &mut self,
        op: &Active<'_>,
        peer: usize,
        dst: &mut [u8],
    ) -> Result<(), WorkError> {
        self.recv_into_with(op, peer, dst, <[u8]>::copy_from_slice)
            .await
    }

    /// [`recv_into`](Self::recv_into) for bytes of `dst` that this op
    /// does not read again, in an op buffer of `total` bytes: copied with
    /// streaming stores ([`shm::copy_out`]) where the buffers of this
    /// host's ranks overflow the last-level cache.
    pub(super) async fn recv_final(
        &mut self,
        op: &Active<'_>,
        peer: usize,
        dst: &mut [u8],
        total: usize,
    ) -> Result<(), WorkError> {
        if total >= self.inner.stream_from {
            self.recv_into_with(op, peer, dst, shm::copy_out).await
        } else {
            self.recv_into(op, peer, dst).await
        }
    }

    async fn recv_into_with(
        &mut self,
        op: &Active<'_>,
        peer: usize,
        dst: &mut [u8],
        copy: fn(&mut [u8], &[u8]),
    ) -> Result<(), WorkError> {
        let idx = self.recvd[peer];
        self.recvd[peer] = idx.wrapping_add(1);
        let got = self.take(op, peer, true).await?;
        self.inner.moved.fetch_add(1, Ordering::Relaxed);
        match got {
            Got::Frame(f) => {
                self.check(op, peer, &f.hdr, idx, dst.len())?;
                copy(dst, f.payload.bytes());
            }
            Got::Lent(Lent { hdr, rd, back }) => {
                // On a bad header the read side is dropped with the error:
                // the op fails, and with it the group.
                self.check(op, peer, &hdr, idx, dst.len())?;
                read_lent(op, peer, rd, back, dst, self.inner.opts.liveness_timeout).await?;
            }
        }
        Ok(())
    }

    /// [`absorb`](Self::absorb) for `watching`.
    pub(super) async fn absorb_lent(
        &mut self,
        op: &Active<'_>,
        peer: usize,
        l: Lent,
    ) -> Result<Frame, WorkError> {
        self.absorb(op, peer, l).await
    }

    /// Reads a lent frame's payload into a pool buffer and gives the read
    /// side back.
    async fn absorb(&mut self, op: &Active<'_>, peer: usize, l: Lent) -> Result<Frame, WorkError> {
        let Lent { hdr, rd, back } = l;
        let mut payload = self.inner.pool.get(hdr.len as usize);
        read_lent(
            op,
            peer,
            rd,
            back,
            payload.bytes_mut(),
            self.inner.opts.liveness_timeout,
        )
        .await?;
        Ok(Frame {
            hdr,
            payload: Payload::Pool(payload),
        })
    }

    /// The next item of `op`'s class from `peer`. With `direct`, a large
    /// collective frame that has not arrived yet may come as a lent read
    /// side (see [`Link`]).
    async fn take(&mut self, op: &Active<'_>, peer: usize, direct: bool) -> Result<Got, WorkError> {
        self.ensure(op.ctx, peer).await?;
        let no_conn = || WorkError::Backend {
            ctx: op.ctx.clone(),
            msg: format!("no connection to rank {peer}"),
        };
        // Frames that already arrived are used even if their sender has gone
        // since; only an op that needs more from a peer whose connection
        // ended fails (at once, as the queue is closed). A peer that waits on
        // the lost one fails and closes in turn, so failures spread through
        // the group without waiting for timeouts.
        if op.class == CLASS_P2P {
            let q = self
                .p2p
                .get_mut(peer)
                .and_then(Option::as_mut)
                .ok_or_else(no_conn)?;
            return match q.recv().await {
                Some(f) => Ok(Got::Frame(f)),
                None => Err(self.inner.lost_error(op.ctx, peer).await),
            };
        }
        if let Some(f) = self.stash.get_mut(peer).and_then(VecDeque::pop_front) {
            return Ok(Got::Frame(f));
        }
        loop {
            let q = self
                .coll
                .get_mut(peer)
                .and_then(Option::as_mut)
                .ok_or_else(no_conn)?;
            let (item, claimed) = match q.try_recv() {
                Ok(item) => (Some(item), false),
                Err(TryRecvError::Disconnected) => (None, false),
                Err(TryRecvError::Empty) => {
                    let link = if direct {
                        self.links[peer].clone()
                    } else {
                        None
                    };
                    if let Some(l) = &link {
                        l.want.store(true, Ordering::Release);
                    }
                    let item = self.wait_watching(op, peer).await;
                    // Whether the reader took the offer (for this item or
                    // for the next one).
                    let claimed = link.is_some_and(|l| !l.want.swap(false, Ordering::AcqRel));
                    (item?, claimed)
                }
            };
            let q = self
                .coll
                .get_mut(peer)
                .and_then(Option::as_mut)
                .ok_or_else(no_conn)?;
            let Some(item) = item else {
                return Err(self.inner.lost_error(op.ctx, peer).await);
            };
            if claimed && !matches!(item, Incoming::Lent(_)) {
                // The reader claimed the offer for the frame after this
                // one: take it now, so that the reader never waits on a
                // worker busy elsewhere.
                let next = q.recv().await;
                match next {
                    Some(Incoming::Lent(l)) => {
                        let f = self.absorb(op, peer, l).await?;
                        self.stash[peer].push_back(f);
                    }
                    Some(Incoming::Frame(f)) => self.stash[peer].push_back(f),
                    Some(Incoming::Link(l)) => self.links[peer] = Some(l),
                    None => {}
                }
            }
            match item {
                Incoming::Link(l) => self.links[peer] = Some(l),
                Incoming::Frame(f) => return Ok(Got::Frame(f)),
                Incoming::Lent(l) => return Ok(Got::Lent(l)),
            }
        }
    }

    fn check(
        &self,
        op: &Active<'_>,
        peer: usize,
        h: &Header,
        idx: u32,
        len: usize,
    ) -> Result<(), WorkError> {
        let me = self.me();
        if h.group != self.inner.group_hash {
            return Err(WorkError::Backend {
                ctx: op.ctx.clone(),
                msg: format!(
                    "rank {peer} sent a frame of another group (hash {:#010x}, expected {:#010x})",
                    h.group, self.inner.group_hash
                ),
            });
        }
        let (t, o) = (&h.sig, &op.sig);
        if op.class != CLASS_P2P && t.seq != o.seq && self.inner.progress.is_late(t.seq) {
            // A frame of an op this rank finished without it.
            return Err(self
                .inner
                .progress
                .late_mismatch(op.ctx.clone(), me, peer, t));
        }
        let same_op = t.seq == o.seq
            && t.op == o.op
            && t.dtype == o.dtype
            && t.redop == o.redop
            && t.root == o.root
            && t.count == o.count;
        if !same_op {
            return Err(WorkError::Mismatch {
                ctx: op.ctx.clone(),
                detail: mismatch_detail(peer, t, me, o, op.ctx.op),
            });
        }
        if t.algo != o.algo || h.frame != idx || h.len != len as u64 {
            return Err(WorkError::Mismatch {
                ctx: op.ctx.clone(),
                detail: format!(
                    "rank {peer} at seq {} sent frame {} ({} bytes, algorithm {}) of {}(count={}) but rank {me} expected frame {idx} ({len} bytes, algorithm {}): the ranks cut the op differently (different TcpOptions or chorus versions?)",
                    t.seq,
                    h.frame,
                    h.len,
                    t.algo,
                    op_name(t.op),
                    t.count,
                    o.algo
                ),
            });
        }
        Ok(())
    }
}

/// Reads a lent frame's payload into `dst` and gives the read side back to
/// its reader (or, if the read failed, the reason, and fails the op with
/// the peer lost).
async fn read_lent(
    op: &Active<'_>,
    peer: usize,
    mut rd: super::conn::Rd,
    back: tokio::sync::oneshot::Sender<Result<super::conn::Rd, String>>,
    dst: &mut [u8],
    live: Duration,
) -> Result<(), WorkError> {
    if let Err(e) = rd.read_exact(dst).await {
        let cause = format!("read failed mid-frame: {e}");
        let _ = back.send(Err(cause.clone()));
        if let PeerState::Silent(after) = super::conn::read_failed(&e, live) {
            return Err(WorkError::PeerSilent {
                ctx: op.ctx.clone(),
                peer,
                after,
            });
        }
        return Err(WorkError::PeerLost {
            ctx: op.ctx.clone(),
            peer,
            cause,
        });
    }
    let _ = back.send(Ok(rd));
    Ok(())
}
