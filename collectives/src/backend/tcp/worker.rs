//! The per-group worker: runs ops one at a time in submission order, sends
//! and receives the frames of each op and checks every header it receives.

use std::sync::Arc;
use std::time::Duration;

use chorus_runtime::{OpContext, WorkError};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;
use tracing::Instrument;

use super::conn::{Frame, PeerState, Writer};
use super::wire::{op_name, Header, Sig, CLASS_BYE, CLASS_P2P, NONE32, NONE8};
use super::Inner;
use crate::backend::{OpKind, OpRequest};

/// One running op, as the frame helpers see it.
#[derive(Debug)]
pub(super) struct Op<'a> {
    pub(super) ctx: &'a OpContext,
    pub(super) sig: Sig,
    pub(super) class: u8,
}

/// The worker task's state. It alone writes to the connections.
#[derive(Debug)]
pub(super) struct Worker {
    pub(super) inner: Arc<Inner>,
    writers: Vec<Option<Writer>>,
    coll: Vec<Option<UnboundedReceiver<Frame>>>,
    p2p: Vec<Option<UnboundedReceiver<Frame>>>,
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

async fn stopped(stop: &mut watch::Receiver<bool>) {
    // The sender lives in `Inner`, which the worker holds: `wait_for` only
    // returns once the flag is set.
    let _ = stop.wait_for(|s| *s).await;
}

/// Bytes an op moves from this rank's point of view (for traces).
fn op_bytes(kind: &OpKind) -> usize {
    match kind {
        OpKind::AllReduce { buf, .. }
        | OpKind::Broadcast { buf, .. }
        | OpKind::Reduce { buf, .. }
        | OpKind::Send { buf, .. }
        | OpKind::Recv { buf, .. } => buf.as_bytes().len(),
        OpKind::AllGather { output, .. } | OpKind::AllToAll { output, .. } => {
            output.as_bytes().len()
        }
        OpKind::ReduceScatter { input, .. } => input.as_bytes().len(),
        OpKind::Barrier => 0,
    }
}

impl Worker {
    pub(super) fn new(
        inner: Arc<Inner>,
        writers: Vec<Option<Writer>>,
        coll: Vec<Option<UnboundedReceiver<Frame>>>,
        p2p: Vec<Option<UnboundedReceiver<Frame>>>,
    ) -> Worker {
        let n = inner.size;
        Worker {
            inner,
            writers,
            coll,
            p2p,
            sent: vec![0; n],
            recvd: vec![0; n],
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
        let graceful = loop {
            let next = tokio::select! {
                biased;
                () = stopped(&mut stop) => None,
                r = rx.recv() => Some(r),
                () = stopped(&mut close) => Some(None),
            };
            let req = match next {
                None => break false,
                Some(None) => break true,
                Some(Some(req)) => req,
            };
            let OpRequest {
                ctx,
                mut kind,
                timeout,
                completer,
            } = req;
            if let Some(cause) = inner.failure() {
                completer.complete(Err(cause.for_op(ctx)));
                break false;
            }
            completer.started();
            let span = tracing::debug_span!(
                "tcp_op",
                group = %ctx.group,
                rank = ctx.rank,
                seq = ctx.seq,
                op = ctx.op,
                bytes = op_bytes(&kind)
            );
            let res = async {
                tokio::select! {
                    // The op first: frames that already arrived (a peer's
                    // mismatching header) are looked at before a stop caused by
                    // that peer closing its connection.
                    biased;
                    r = tokio::time::timeout(timeout, self.execute(&ctx, &mut kind)) => match r {
                        Ok(r) => r,
                        Err(_) => Err(WorkError::OpTimeout { ctx: ctx.clone(), after: timeout }),
                    },
                    () = stopped(&mut stop) => Err(inner.settle().for_op(ctx.clone())),
                }
            }
            .instrument(span)
            .await;
            match res {
                Ok(()) => completer.complete(Ok(kind.into_buffers())),
                Err(e) => {
                    tracing::debug!(op = %ctx, error = %e, "op failed");
                    inner.fail(&e);
                    // The op's future is gone: no socket touches the buffers
                    // any more, and they are released with the error.
                    completer.complete(Err(e));
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
            req.completer.complete(Err(err));
        }
        if graceful {
            self.say_goodbye().await;
            await_goodbyes(&inner).await;
        }
        // Closing the write halves sends FIN; aborting the readers drops the
        // read halves, which closes the sockets.
        self.writers.clear();
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
        op: &Op<'_>,
        peer: usize,
        payload: &[u8],
    ) -> Result<(), WorkError> {
        let frame = self.sent[peer];
        self.sent[peer] = frame.wrapping_add(1);
        if self.inner.peer_state(peer) != PeerState::Open {
            return Err(self.inner.lost_error(op.ctx, peer));
        }
        let hdr = Header {
            group: self.inner.group_hash,
            class: op.class,
            sig: op.sig,
            frame,
            len: payload.len() as u64,
        }
        .encode();
        let Some(w) = self.writers.get_mut(peer).and_then(Option::as_mut) else {
            return Err(WorkError::Backend {
                ctx: op.ctx.clone(),
                msg: format!("no connection to rank {peer}"),
            });
        };
        w.write_frame(&hdr, payload)
            .await
            .map_err(|e| WorkError::PeerLost {
                ctx: op.ctx.clone(),
                peer,
                cause: format!("write failed: {e}"),
            })
    }

    /// Receives the next frame of `op` from `peer` and checks its header;
    /// the payload must be `len` bytes.
    pub(super) async fn recv(
        &mut self,
        op: &Op<'_>,
        peer: usize,
        len: usize,
    ) -> Result<Frame, WorkError> {
        let idx = self.recvd[peer];
        self.recvd[peer] = idx.wrapping_add(1);
        let queues = if op.class == CLASS_P2P {
            &mut self.p2p
        } else {
            &mut self.coll
        };
        let Some(q) = queues.get_mut(peer).and_then(Option::as_mut) else {
            return Err(WorkError::Backend {
                ctx: op.ctx.clone(),
                msg: format!("no connection to rank {peer}"),
            });
        };
        // Frames that already arrived are used even if their sender has gone
        // since; only an op that needs more from a peer whose connection
        // ended fails (at once, as the queue is closed). A peer that waits on
        // the lost one fails and closes in turn, so failures spread through
        // the group without waiting for timeouts.
        let Some(f) = q.recv().await else {
            return Err(self.inner.lost_error(op.ctx, peer));
        };
        self.check(op, peer, &f.hdr, idx, len)?;
        Ok(f)
    }

    fn check(
        &self,
        op: &Op<'_>,
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
        let same_op = t.seq == o.seq
            && t.op == o.op
            && t.dtype == o.dtype
            && t.redop == o.redop
            && t.root == o.root
            && t.count == o.count;
        if !same_op {
            let theirs = t.describe(op_name(t.op), o);
            let ours = o.describe(op.ctx.op, t);
            let detail = if t.seq == o.seq {
                format!(
                    "rank {peer} at seq {} called {theirs} but rank {me} called {ours}",
                    t.seq
                )
            } else {
                format!(
                    "rank {peer} at seq {} called {theirs} but rank {me} at seq {} called {ours}",
                    t.seq, o.seq
                )
            };
            return Err(WorkError::Mismatch {
                ctx: op.ctx.clone(),
                detail,
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
