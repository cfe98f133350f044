//! Connections on first use: the worker opens the connection to a peer
//! when an op first sends to it or waits for it (see `links` for who
//! dials), and learns from the store whether every rank is on this host.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_core::{OpContext, WorkError};
use chorus_store::Store;
use tracing::Instrument;

use super::install::install;
use super::links::{Installed, Next};
use super::setup::{self, Dialled, Me, SetupError};
use super::state::{Inner, PeerState};
use super::worker::Worker;

/// Groups up to this size run the large all_reduce through broadcast
/// segments when every rank is on one host (it talks to every rank, and
/// finding out reads every rank's address).
const ALL_LOCAL_MAX: usize = 16;

/// How long a failed connect waits for a fault notice that names the
/// cause (a peer that cannot be reached most often failed or left).
const NOTICE_GRACE: Duration = Duration::from_millis(50);

/// What the worker needs to open connections.
#[derive(Debug)]
pub(super) struct Dialer {
    pub(super) inner: Arc<Inner>,
    pub(super) me: Arc<Me>,
    pub(super) store: Arc<dyn Store>,
    /// This host's id, where local peers are reached through Unix sockets.
    pub(super) host: Option<String>,
}

impl Dialer {
    /// The connection to `peer`: dialled by this rank, or the one the peer
    /// dials (see `links`), by `deadline`.
    ///
    /// # Errors
    ///
    /// Why no connection came: the store failed, the peer refused, did not
    /// answer or disagreed in the handshake.
    pub(super) async fn open(
        &self,
        peer: usize,
        deadline: Instant,
    ) -> Result<Box<Installed>, SetupError> {
        let links = &self.inner.links;
        loop {
            let arrived = links.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            match links.next(peer) {
                Next::Ready(i) => return Ok(i),
                Next::Dial => {
                    let host = self.host.as_deref();
                    match setup::dial(&self.me, &*self.store, host, peer, deadline).await {
                        Ok(Dialled::Conn(c)) => {
                            let i = install(&self.inner, peer, c).inspect_err(|_| {
                                links.dial_failed(peer);
                            })?;
                            links.dialled(peer);
                            return Ok(Box::new(i));
                        }
                        Ok(Dialled::Dup) => links.refused(peer),
                        Err(e) => {
                            links.dial_failed(peer);
                            return Err(e);
                        }
                    }
                }
                Next::Wait => {
                    if tokio::time::timeout_at(deadline.into(), arrived)
                        .await
                        .is_err()
                    {
                        return Err(SetupError::Other(format!(
                            "rank {peer} did not complete its connection to this rank within {:?} (TcpOptions::connect_timeout)",
                            self.me.opts.connect_timeout
                        )));
                    }
                }
            }
        }
    }

    /// Whether every rank published this host and a broadcast segment (the
    /// same answer on every rank: it comes from the store alone). Always
    /// false above [`ALL_LOCAL_MAX`] ranks.
    async fn all_local(&self) -> Result<bool, SetupError> {
        let (n, me) = (self.inner.size, self.inner.rank);
        let Some(host) = self.host.as_deref() else {
            return Ok(false);
        };
        if n > ALL_LOCAL_MAX || self.me.bcast.is_none() {
            return Ok(false);
        }
        let deadline = Instant::now() + self.me.opts.connect_timeout;
        for p in (0..n).filter(|&p| p != me) {
            let a = setup::peer_addr(&*self.store, p, deadline).await?;
            if !a.shm || a.unix.as_ref().is_none_or(|(h, _)| h != host) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

impl Worker {
    /// Opens the connection to `peer` if it has none yet, for the op `ctx`.
    ///
    /// # Errors
    ///
    /// The op's error naming the peer when no connection came within the
    /// connect timeout (or the cause of the group's failure, if a fault
    /// notice names one meanwhile).
    pub(super) async fn ensure(&mut self, ctx: &OpContext, peer: usize) -> Result<(), WorkError> {
        if self.is_connected(peer) {
            return Ok(());
        }
        self.adopt_arrived();
        if self.is_connected(peer) {
            return Ok(());
        }
        let deadline = Instant::now() + self.inner.opts.connect_timeout;
        let span = tracing::debug_span!("tcp_connect", group = %ctx.group, rank = ctx.rank, peer);
        match self.dialer.open(peer, deadline).instrument(span).await {
            Ok(i) => {
                self.adopt(peer, *i);
                Ok(())
            }
            Err(e) => Err(self.connect_error(ctx, peer, e).await),
        }
    }

    /// Opens connections to every peer not yet connected, by `deadline`,
    /// best effort (for fault notices).
    pub(super) async fn ensure_all(&mut self, deadline: Instant) {
        self.adopt_arrived();
        let (n, me) = (self.n(), self.me());
        let missing: Vec<usize> = (0..n)
            .filter(|&p| p != me && !self.is_connected(p))
            .collect();
        let dialer = &self.dialer;
        let opened = futures::future::join_all(
            missing
                .iter()
                .map(|&p| async move { (p, dialer.open(p, deadline).await) }),
        )
        .await;
        for (p, r) in opened {
            if let Ok(i) = r {
                self.adopt(p, *i);
            }
        }
    }

    /// Whether the large all_reduce may use the broadcast segments (the
    /// same answer on every rank; found out once).
    pub(super) async fn all_local(&mut self, ctx: &OpContext) -> Result<bool, WorkError> {
        if let Some(a) = self.shm.all_local {
            return Ok(a);
        }
        let a = match self.dialer.all_local().await {
            Ok(a) => a,
            Err(SetupError::Store(e)) => {
                return Err(WorkError::Store {
                    ctx: ctx.clone(),
                    cause: format!("reading the ranks' addresses: {e}"),
                })
            }
            Err(SetupError::Other(msg) | SetupError::Gone(msg)) => {
                return Err(WorkError::Backend {
                    ctx: ctx.clone(),
                    msg,
                })
            }
        };
        self.shm.all_local = Some(a);
        Ok(a)
    }

    /// The error of op `ctx` whose connection to `peer` failed with `e`: the
    /// group's failure if a fault notice names one within
    /// [`NOTICE_GRACE`], how the peer ended if it did, else what failed and
    /// what to check.
    async fn connect_error(&self, ctx: &OpContext, peer: usize, e: SetupError) -> WorkError {
        let start = tokio::time::Instant::now();
        loop {
            if let Some(cause) = self.inner.failure() {
                return cause.for_op(ctx.clone());
            }
            let state = self.inner.peer_state(peer);
            if !matches!(state, PeerState::Unconnected | PeerState::Open) {
                return state.error(ctx, peer);
            }
            if start.elapsed() >= NOTICE_GRACE {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        match e {
            SetupError::Store(e) => WorkError::Store {
                ctx: ctx.clone(),
                cause: format!("reading rank {peer}'s address to connect to it: {e}"),
            },
            SetupError::Gone(cause) => WorkError::PeerLost {
                ctx: ctx.clone(),
                peer,
                cause: format!("cannot connect to it: {cause}"),
            },
            SetupError::Other(msg) => WorkError::Backend {
                ctx: ctx.clone(),
                msg: format!(
                    "cannot connect to rank {peer}: {msg}; check that rank {peer} is running, created this group with the same name, size and TcpOptions, and can be reached from this host (TcpOptions::advertise_ip)"
                ),
            },
        }
    }
}
