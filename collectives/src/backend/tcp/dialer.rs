//! [`Dialer`]: what the worker needs to open a connection to a peer when
//! an op first needs it (see `links` for who dials), and to learn from the
//! store whether every rank is on this host.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Instant;

use chorus_core::sync::lock;
use chorus_store::Store;

use super::install::{install, Installed, LinkTable};
use super::links::Next;
use super::setup::{self, Dialled, Me, SetupError};
use super::state::Inner;

/// Groups up to this size run the large all_reduce through broadcast
/// segments when every rank is on one host (it talks to every rank, and
/// finding out reads every rank's address).
const ALL_LOCAL_MAX: usize = 16;

/// What the worker needs to open connections.
#[derive(Debug)]
pub(super) struct Dialer {
    pub(super) inner: Arc<Inner>,
    /// This rank's table of connections, shared with the acceptor.
    pub(super) links: Arc<LinkTable>,
    pub(super) me: Arc<Me>,
    pub(super) store: Arc<dyn Store>,
    /// This host's id, where local peers are reached through Unix sockets.
    pub(super) host: Option<String>,
    /// The acceptor task, if this rank listens.
    pub(super) acceptor: Mutex<Option<tokio::task::AbortHandle>>,
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
        let links = &self.links;
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
                            let i = install(&self.inner, links, peer, c).inspect_err(|_| {
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

    /// Stops taking connections: closes the table and ends the acceptor
    /// (once the worker has stopped: until then a failed rank still
    /// connects to tell its peers why).
    pub(super) fn stop(&self) {
        self.links.close();
        if let Some(a) = lock(&self.acceptor).take() {
            a.abort();
        }
    }

    /// Whether every rank published this host and a broadcast segment (the
    /// same answer on every rank: it comes from the store alone). Always
    /// false above [`ALL_LOCAL_MAX`] ranks.
    pub(super) async fn all_local(&self) -> Result<bool, SetupError> {
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
