//! The acceptor task: answers the connections peers dial to this rank,
//! runs their handshakes (each bounded by the connect timeout) and hands
//! the connections it takes to the worker through the link table (see
//! `links` for which it takes).

use std::sync::Arc;
use std::time::Duration;

use chorus_core::sync::lock;
use chorus_core::WorkError;
use futures::stream::{FuturesUnordered, StreamExt};

use super::install::{install, LinkTable};
use super::links::Taking;
use super::setup::{accept_any, accept_stream, Listening, Me, Refused};
use super::state::Inner;

/// Accepts connections into `links` until the task is aborted (when the
/// backend stops).
pub(super) async fn acceptor(
    inner: Arc<Inner>,
    links: Arc<LinkTable>,
    me: Arc<Me>,
    lst: Listening,
) {
    let timeout = me.opts.connect_timeout;
    let mut pending = FuturesUnordered::new();
    loop {
        tokio::select! {
            r = accept_any(&lst.tcp, lst.unix.as_ref()) => match r {
                Ok((s, from)) => {
                    let (links, me) = (links.clone(), me.clone());
                    pending.push(async move {
                        // The peer whose connection the table took, to be
                        // given back if its handshake fails.
                        let taken = std::sync::Mutex::new(None);
                        let take = |peer: usize| {
                            let t = links.take(peer);
                            if t == Taking::Take {
                                *lock(&taken) = Some(peer);
                            }
                            t
                        };
                        let r = tokio::time::timeout(timeout, accept_stream(&me, s, &take)).await;
                        let taken = *lock(&taken);
                        if let (Some(peer), Ok(Err(_)) | Err(_)) = (taken, &r) {
                            links.accept_failed(peer);
                        }
                        (from, r)
                    });
                }
                Err(e) => {
                    tracing::warn!(group = %inner.group, rank = inner.rank, error = %e, "accept failed");
                    // A full descriptor table, say: do not spin on it.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some((from, r)) = pending.next(), if !pending.is_empty() => match r {
                Ok(Ok((peer, c))) => match install(&inner, &links, peer, c) {
                    Ok(i) => {
                        // A closed table drops the connection.
                        let _ = links.arrive(peer, Box::new(i));
                    }
                    Err(msg) => {
                        tracing::warn!(group = %inner.group, rank = inner.rank, peer, "cannot use a connection: {msg}");
                        links.accept_failed(peer);
                    }
                },
                Ok(Err(Refused { dup: true, .. })) => {}
                Ok(Err(Refused { msg, fatal, .. })) => {
                    if fatal {
                        // A rank of this group whose settings disagree:
                        // the group cannot work.
                        tracing::warn!(group = %inner.group, rank = inner.rank, %from, "refused a connection: {msg}");
                        inner.fail(&WorkError::Backend {
                            ctx: inner.base_ctx(),
                            msg: format!("refused a connection from {from}: {msg}"),
                        });
                    } else {
                        tracing::warn!(group = %inner.group, rank = inner.rank, %from, "rejected a connection: {msg}");
                    }
                }
                Err(_) => {
                    tracing::warn!(group = %inner.group, rank = inner.rank, %from, "a handshake timed out after {timeout:?}");
                }
            },
        }
    }
}
