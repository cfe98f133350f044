//! Putting a new connection to work: its reader task starts at once (so a
//! peer's frames are drained whatever the worker does), and its write side
//! and queues wait for the worker ([`Installed`]).

use std::sync::Arc;

use chorus_core::relay::Relay;
use chorus_core::sync::lock;
use tokio::sync::mpsc;

use super::conn::{self, Frame, Incoming, Writer};
use super::drive;
use super::links::Links;
use super::pipe_io::{PipeRead, PipeWrite, Sink, Source};
use super::setup::{Conn, UNIX_SOCKET_BUFFER};
use super::shm;
use super::state::Inner;

/// A connection ready for the worker: its write side, the queues its
/// reader fills, and its shared memory.
#[derive(Debug)]
pub(super) struct Installed {
    pub(super) writer: Writer,
    pub(super) coll: tokio::sync::mpsc::UnboundedReceiver<Incoming>,
    pub(super) p2p: tokio::sync::mpsc::UnboundedReceiver<Frame>,
    /// The segment this rank writes to the peer, if any.
    pub(super) shm_tx: Option<shm::Tx>,
    /// The peer mapped this rank's broadcast segment.
    pub(super) bcast_ok: bool,
}

/// A rank's table of connections, as the acceptor hands them over.
pub(super) type LinkTable = Links<Box<Installed>>;

/// Starts `peer`'s reader on `c` and returns the rest for the worker;
/// `links`: this rank's table (a closed one ends the reader at once).
///
/// # Errors
///
/// What failed, if the socket cannot be taken from tokio or the I/O
/// runtime is gone.
pub(super) fn install(
    inner: &Arc<Inner>,
    links: &LinkTable,
    peer: usize,
    c: Conn,
) -> Result<Installed, String> {
    let handle = chorus_store::rt::handle()?;
    c.stream
        .tune_buffers(UNIX_SOCKET_BUFFER.max(inner.opts.chunk_bytes + 64));
    let (rd, wr) = c
        .stream
        .split()
        .map_err(|e| format!("cannot take the connection to rank {peer} from tokio: {e}"))?;
    // Between mapped segments the frames go through their pipes; the
    // socket carries doorbells and the end (see `pipe_io`).
    let rd = match &c.shm.rx {
        Some(rx) => Source::Pipe(PipeRead::new(rx.pipe(), rd)),
        None => Source::Socket(rd),
    };
    let wr = match &c.shm.tx {
        Some(tx) => Sink::Pipe(PipeWrite::new(tx.pipe(), wr, inner.doorbells.clone())),
        None => Sink::Socket(wr),
    };
    inner.peer_connected(peer);
    let (ctx, crx) = mpsc::unbounded_channel();
    let (ptx, prx) = mpsc::unbounded_channel();
    let reader = Arc::new(Relay::new(conn::reader(
        peer,
        rd,
        ctx,
        ptx,
        c.shm.rx,
        c.shm.brx,
        inner.clone(),
    )));
    drive::host(&handle, &reader);
    lock(&inner.readers).push(reader.clone());
    // The worker closes the table before it takes the readers for the
    // last time: a reader pushed after that is ended here.
    if links.is_closed() {
        reader.cancel();
    }
    tracing::debug!(group = %inner.group, rank = inner.rank, peer, shm = c.shm.tx.is_some(), before = links.opened(), "connected");
    Ok(Installed {
        writer: conn::Writer::new(wr),
        coll: crx,
        p2p: prx,
        shm_tx: c.shm.tx,
        bcast_ok: c.shm.bcast_ok,
    })
}
