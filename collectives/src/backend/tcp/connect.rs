//! Connections on first use, as the worker sees them: an op that sends to
//! a peer or waits for it first takes its connection into use (opening it
//! through the [`Dialer`](super::dialer::Dialer), or taking the one the
//! peer opened), and a failure to connect becomes the op's error.

use std::time::{Duration, Instant};

use chorus_core::{OpContext, WorkError};
use tracing::Instrument;

use super::setup::SetupError;
use super::state::PeerState;
use super::worker::Worker;

/// How long a failed connect waits for a fault notice that names the
/// cause (a peer that cannot be reached most often failed or left).
const NOTICE_GRACE: Duration = Duration::from_millis(50);

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
        // Boxed: every send and receive awaits `ensure`, and the connect
        // path's state would otherwise make each of their futures large.
        Box::pin(self.connect(ctx, peer)).await
    }

    /// [`ensure`](Self::ensure) for a peer not connected yet.
    async fn connect(&mut self, ctx: &OpContext, peer: usize) -> Result<(), WorkError> {
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
        let a = match Box::pin(self.dialer.all_local()).await {
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
