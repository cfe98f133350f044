//! Waiting on one peer while watching the others: a frame of the op in
//! progress (same seq) whose op, dtype, count, root or reduction differ
//! proves that its sender called something else, which it will never
//! make up for, so the op fails with the mismatch at once instead of
//! waiting on a peer that may itself wait on someone else. The other
//! frames are kept, in order, for when the op asks for them.

use std::future::Future;
use std::task::{Context, Poll};

use chorus_core::WorkError;

use super::conn::{Incoming, Lent};
use super::wire::{mismatch_detail, Sig, CLASS_P2P};
use super::worker::{Active, Worker};

/// Whether `a` and `b` describe the same op (their frames' algorithm
/// aside).
pub(super) fn same_op(a: &Sig, b: &Sig) -> bool {
    a.seq == b.seq
        && a.op == b.op
        && a.dtype == b.dtype
        && a.redop == b.redop
        && a.root == b.root
        && a.count == b.count
}

/// What watching gave.
enum Watched {
    /// The next item from the awaited peer (`None`: its queue closed).
    Item(Option<Incoming>),
    /// Another peer lent its read side: read the frame, then wait again.
    Lent(usize, Lent),
}

impl Worker {
    /// The next collective item from `peer` for `op`, looking meanwhile
    /// at every other connected peer's frames as they arrive.
    ///
    /// # Errors
    ///
    /// [`WorkError::Mismatch`] when another peer's frame shows that it
    /// called a different op at this seq.
    pub(super) async fn wait_watching(
        &mut self,
        op: &Active<'_>,
        peer: usize,
    ) -> Result<Option<Incoming>, WorkError> {
        loop {
            match self.watch_once(op, peer).await? {
                Watched::Item(i) => return Ok(i),
                Watched::Lent(p, l) => {
                    let f = self.absorb_lent(op, p, l).await?;
                    self.look_at(op, p, &f.hdr.sig)?;
                    self.stash[p].push_back(f);
                }
            }
        }
    }

    /// The mismatch a frame from `p` with signature `t` shows, if any.
    fn look_at(&self, op: &Active<'_>, p: usize, t: &Sig) -> Result<(), WorkError> {
        if t.seq == op.sig.seq && !same_op(t, &op.sig) {
            return Err(WorkError::Mismatch {
                ctx: op.ctx.clone(),
                detail: mismatch_detail(p, t, self.me(), &op.sig, op.ctx.op),
            });
        }
        Ok(())
    }

    /// Waits for the next item from `peer`, a mismatch, or a lent frame
    /// of another peer; connections peers make meanwhile are taken into
    /// use (and watched).
    async fn watch_once(&mut self, op: &Active<'_>, peer: usize) -> Result<Watched, WorkError> {
        loop {
            let links = self.dialer.links.clone();
            // Woken by any arrival from here on, polled or not.
            let arrived = links.arrived.notified();
            tokio::pin!(arrived);
            self.adopt_arrived();
            if let Some(w) = std::future::poll_fn(|cx| {
                if let Poll::Ready(w) = self.poll_watch(cx, op, peer) {
                    return Poll::Ready(Some(w));
                }
                arrived.as_mut().poll(cx).map(|()| None)
            })
            .await
            {
                return w;
            }
        }
    }

    fn poll_watch(
        &mut self,
        cx: &mut std::task::Context<'_>,
        op: &Active<'_>,
        peer: usize,
    ) -> Poll<Result<Watched, WorkError>> {
        let watch = op.class != CLASS_P2P;
        let Some(q) = self.coll.get_mut(peer).and_then(Option::as_mut) else {
            return Poll::Ready(Ok(Watched::Item(None)));
        };
        if let Poll::Ready(item) = q.poll_recv(cx) {
            return Poll::Ready(Ok(Watched::Item(item)));
        }
        if !watch {
            return Poll::Pending;
        }
        self.poll_others(cx, op, Some(peer))
    }

    /// Looks at the frames that arrived from every connected peer but
    /// `except`: ready with a mismatch, or with a peer's lent read side;
    /// the other frames are stashed.
    fn poll_others(
        &mut self,
        cx: &mut Context<'_>,
        op: &Active<'_>,
        except: Option<usize>,
    ) -> Poll<Result<Watched, WorkError>> {
        for p in 0..self.coll.len() {
            if Some(p) == except {
                continue;
            }
            while let Some(Poll::Ready(Some(item))) = self.coll[p].as_mut().map(|q| q.poll_recv(cx))
            {
                match item {
                    Incoming::Frame(f) => {
                        if let Err(e) = self.look_at(op, p, &f.hdr.sig) {
                            return Poll::Ready(Err(e));
                        }
                        self.stash[p].push_back(f);
                    }
                    Incoming::Link(l) => self.links[p] = Some(l),
                    Incoming::Lent(l) => return Poll::Ready(Ok(Watched::Lent(p, l))),
                }
            }
        }
        Poll::Pending
    }

    /// Waits until `ready` is, watching every connected peer's frames
    /// meanwhile (an op that exchanges no frames: the board's).
    ///
    /// # Errors
    ///
    /// `ready`'s error, or [`WorkError::Mismatch`] when a peer's frame
    /// shows that it called a different op at this seq.
    pub(super) async fn wait_watching_all(
        &mut self,
        op: &Active<'_>,
        ready: &mut (dyn FnMut(&mut Context<'_>) -> Poll<Result<(), WorkError>> + Send),
    ) -> Result<(), WorkError> {
        loop {
            let links = self.dialer.links.clone();
            let arrived = links.arrived.notified();
            tokio::pin!(arrived);
            self.adopt_arrived();
            let got = std::future::poll_fn(|cx| {
                if let Poll::Ready(r) = ready(cx) {
                    return Poll::Ready(Some(r.map(|()| None)));
                }
                if let Poll::Ready(w) = self.poll_others(cx, op, None) {
                    return Poll::Ready(Some(w.map(Some)));
                }
                arrived.as_mut().poll(cx).map(|()| None)
            })
            .await;
            match got {
                // A connection arrived: take it into use and watch it too.
                None => {}
                Some(Ok(None)) => return Ok(()),
                Some(Ok(Some(Watched::Lent(p, l)))) => {
                    let f = self.absorb_lent(op, p, l).await?;
                    self.look_at(op, p, &f.hdr.sig)?;
                    self.stash[p].push_back(f);
                }
                Some(Ok(Some(Watched::Item(_)))) => {}
                Some(Err(e)) => return Err(e),
            }
        }
    }
}
