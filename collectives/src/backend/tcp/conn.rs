//! Connections to peers: the receive-buffer pool, the reader task of each
//! peer and the write side the worker uses.

use std::io::{self, IoSlice};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::pipe_io::{Sink, Source};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

use super::notice::{Notice, MAX_NOTICE};
use super::pool::PoolBuf;
use super::shm;
use super::state::{Inner, PeerState};
use super::wire::{Header, CLASS_BYE, CLASS_COLL, CLASS_FAULT, CLASS_P2P, HEADER_LEN};

/// A received frame's payload: read from the socket into a pool buffer, or
/// left by the peer in a shared-memory slot (freed when dropped).
#[derive(Debug)]
pub(super) enum Payload {
    Pool(PoolBuf),
    Shm(shm::Slot),
}

impl Payload {
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Payload::Pool(p) => p.bytes(),
            Payload::Shm(s) => s.bytes(),
        }
    }

    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Payload::Pool(p) => p.bytes_mut(),
            Payload::Shm(s) => s.bytes_mut(),
        }
    }
}

/// A received frame.
#[derive(Debug)]
pub(super) struct Frame {
    pub(super) hdr: Header,
    pub(super) payload: Payload,
}

/// The buffered read side of a connection.
pub(super) type Rd = Box<BufReader<Source>>;

/// Shared by a peer's reader task and the worker: lets the worker receive
/// a frame's payload straight into its destination (no copy through a pool
/// buffer).
///
/// The worker sets `want` just before it waits on the peer's empty
/// collective queue. The reader claims it (swaps it back to false) when the
/// next collective frame's header is in and its payload is large: then it
/// lends its read side to the worker ([`Incoming::Lent`]) instead of
/// reading the payload itself, and waits until the worker gives it back.
/// A worker that finds the claim taken although it received something else
/// reads the lent frame at once (into a pool buffer), so a lent read side
/// never waits on the worker while the worker waits on something else.
#[derive(Debug, Default)]
pub(super) struct Link {
    pub(super) want: AtomicBool,
}

/// A frame whose header was read and whose payload is still in the socket;
/// the worker reads it from `rd` and gives `rd` back through `back` (or the
/// reason the stream broke).
pub(super) struct Lent {
    pub(super) hdr: Header,
    pub(super) rd: Rd,
    pub(super) back: oneshot::Sender<Result<Rd, String>>,
}

impl std::fmt::Debug for Lent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lent").field("hdr", &self.hdr).finish()
    }
}

/// What a reader task puts on a peer's collective queue.
#[derive(Debug)]
pub(super) enum Incoming {
    /// The connection's [`Link`]; always the first item.
    Link(Arc<Link>),
    /// A whole frame.
    Frame(Frame),
    /// A frame whose payload the worker reads itself.
    Lent(Lent),
}

/// Collective frames from this size on may be read by the worker straight
/// into their destination; smaller ones are mostly in the reader's buffer
/// already.
const LEND_MIN: u64 = 32 << 10;

/// How a connection ended whose read failed with `e`: `ETIMEDOUT` is the
/// liveness timeout `live` (the kernel's keepalive probes or unacknowledged
/// data gave up), anything else a broken connection.
pub(super) fn read_failed(e: &io::Error, live: Duration) -> PeerState {
    if e.kind() == io::ErrorKind::TimedOut && !live.is_zero() {
        PeerState::Silent(live)
    } else {
        PeerState::Lost(format!("read failed: {e}"))
    }
}

/// Queues a received collective frame for the worker (a closed queue
/// means the worker is gone: the frame is dropped). The worker tells a
/// frame that came for an op it finished (see `state::Progress`).
fn deliver_coll(coll: &UnboundedSender<Incoming>, f: Frame) {
    let _ = coll.send(Incoming::Frame(f));
}

/// Reads a fault notice of `len` bytes: how the peer's group failed, as
/// this rank sees it.
async fn read_notice(rd: &mut Rd, peer: usize, hdr: &Header, inner: &Inner) -> PeerState {
    if hdr.len > MAX_NOTICE as u64 {
        return PeerState::Lost(format!(
            "fault notice of {} bytes exceeds {MAX_NOTICE} (corrupt stream?)",
            hdr.len
        ));
    }
    let mut b = vec![0u8; hdr.len as usize];
    if let Err(e) = rd.read_exact(&mut b).await {
        return PeerState::Lost(format!("read failed in the peer's fault notice: {e}"));
    }
    match Notice::decode(&b) {
        Ok(n) => {
            let cause = n.error(inner.base_ctx(), peer);
            tracing::debug!(group = %inner.group, rank = inner.rank, peer, error = %cause, "the peer's group failed");
            inner.peer_failed(peer, hdr.sig.seq, cause.clone());
            PeerState::Failed(cause)
        }
        Err(msg) => PeerState::Lost(msg),
    }
}

/// Reads frames from `peer` as they arrive and queues them for the worker,
/// so that a sender never waits for the receiver to reach the op.
///
/// A frame whose header names a shared-memory slot carries no payload on
/// the socket: its payload is the slot (`shm`, the segment from this peer).
///
/// Ends at the peer's goodbye, at its fault notice (which fails the group,
/// now or at the seq it names), at EOF or on an error; an abrupt end fails
/// the backend at once (even if no op is waiting on this peer).
pub(super) async fn reader(
    peer: usize,
    rd: Source,
    coll: UnboundedSender<Incoming>,
    p2p: UnboundedSender<Frame>,
    shm: Option<shm::Rx>,
    bcast: Option<shm::Rx>,
    inner: Arc<Inner>,
) {
    let link = Arc::new(Link::default());
    let _ = coll.send(Incoming::Link(link.clone()));
    // Small frames arrive whole in one read; for large ones at most this much
    // is copied through the buffer before reads go straight to the payload.
    let mut rd: Rd = Box::new(BufReader::with_capacity(4 << 10, rd));
    let mut hb = [0u8; HEADER_LEN];
    let end = loop {
        match rd.read_exact(&mut hb).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                break PeerState::Lost(
                    "the connection closed without a goodbye (the process died, or its group failed or was aborted)"
                        .into(),
                )
            }
            Err(e) => break read_failed(&e, inner.opts.liveness_timeout),
        }
        let hdr = match Header::decode(&hb) {
            Ok(h) => h,
            Err(msg) => break PeerState::Lost(msg),
        };
        if hdr.class == CLASS_BYE {
            break PeerState::Departed;
        }
        if hdr.class == CLASS_FAULT {
            break read_notice(&mut rd, peer, &hdr, &inner).await;
        }
        if hdr.len > inner.opts.chunk_bytes as u64 {
            break PeerState::Lost(format!(
                "frame of {} bytes exceeds the chunk size {} (corrupt stream, or the ranks' TcpOptions differ)",
                hdr.len, inner.opts.chunk_bytes
            ));
        }
        if hdr.shm != 0 {
            let seg = if hdr.shm & shm::BCAST_BIT != 0 {
                &bcast
            } else {
                &shm
            };
            let Some(rx) = seg else {
                break PeerState::Lost(
                    "the peer sent a shared-memory frame, but this pair has no such segment (corrupt stream?)"
                        .into(),
                );
            };
            let slot = (hdr.shm & !shm::BCAST_BIT).wrapping_sub(1);
            let payload = match rx.take(slot, hdr.len) {
                Ok(slot) => Payload::Shm(slot),
                Err(msg) => break PeerState::Lost(msg),
            };
            if hdr.class == CLASS_P2P {
                let _ = p2p.send(Frame { hdr, payload });
            } else {
                deliver_coll(&coll, Frame { hdr, payload });
            }
            continue;
        }
        if hdr.class == CLASS_COLL
            && hdr.len >= LEND_MIN
            && link
                .want
                .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            let (back, got) = oneshot::channel();
            match coll.send(Incoming::Lent(Lent { hdr, rd, back })) {
                Ok(()) => match got.await {
                    Ok(Ok(r)) => {
                        rd = r;
                        continue;
                    }
                    Ok(Err(cause)) => break PeerState::Lost(cause),
                    Err(_) => {
                        break PeerState::Lost(
                            "this rank's op stopped in the middle of a frame from this peer".into(),
                        )
                    }
                },
                // The worker is gone: read the payload and drop it.
                Err(tokio::sync::mpsc::error::SendError(item)) => {
                    let Incoming::Lent(l) = item else {
                        break PeerState::Lost("internal: lost the connection's read side".into());
                    };
                    rd = l.rd;
                }
            }
        }
        let mut payload = inner.pool.get(hdr.len as usize);
        if let Err(e) = rd.read_exact(payload.bytes_mut()).await {
            break match read_failed(&e, inner.opts.liveness_timeout) {
                PeerState::Lost(_) => PeerState::Lost(format!("read failed mid-frame: {e}")),
                silent => silent,
            };
        }
        let payload = Payload::Pool(payload);
        // A closed queue means the worker is gone: drop the frame.
        if hdr.class == CLASS_P2P {
            let _ = p2p.send(Frame { hdr, payload });
        } else {
            deliver_coll(&coll, Frame { hdr, payload });
        }
    };
    tracing::debug!(group = %inner.group, rank = inner.rank, peer, state = ?end, "peer connection ended");
    inner.peer_ended(peer, end);
    // The queues close when `coll` and `p2p` drop here, after the state is
    // set: a worker that finds a queue closed reads the reason from it.
}

/// The write side of one connection, used only by the worker.
pub(super) struct Writer {
    half: Sink,
    small: Vec<u8>,
    /// A write was stopped in the middle of a frame: the stream is cut,
    /// and nothing more may be written to it.
    cut: bool,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Writer")
    }
}

/// Frames up to this payload size are written with one copy into a scratch
/// buffer and a single `write`.
const SMALL_WRITE: usize = 16 << 10;

impl Writer {
    pub(super) fn new(half: Sink) -> Writer {
        Writer {
            half,
            small: Vec::with_capacity(HEADER_LEN + SMALL_WRITE),
            cut: false,
        }
    }

    /// Whether a frame may still be written: no write was stopped in the
    /// middle of one.
    pub(super) fn whole(&self) -> bool {
        !self.cut
    }

    /// Writes one frame.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: a cancelled write leaves a partial frame on the wire,
    /// and the writer is then no longer [`whole`](Self::whole). The worker
    /// only cancels when the backend fails, after which the connection is
    /// closed.
    pub(super) async fn write_frame(
        &mut self,
        hdr: &[u8; HEADER_LEN],
        payload: &[u8],
    ) -> io::Result<()> {
        self.cut = true;
        let r = self.write_whole(hdr, payload).await;
        self.cut = r.is_err();
        r
    }

    async fn write_whole(&mut self, hdr: &[u8; HEADER_LEN], payload: &[u8]) -> io::Result<()> {
        if payload.len() <= SMALL_WRITE {
            self.small.clear();
            self.small.extend_from_slice(hdr);
            self.small.extend_from_slice(payload);
            return self.half.write_all(&self.small).await;
        }
        let mut h = 0;
        let mut p = 0;
        while h < HEADER_LEN {
            let n = self
                .half
                .write_vectored(&[IoSlice::new(&hdr[h..]), IoSlice::new(&payload[p..])])
                .await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            let from_hdr = n.min(HEADER_LEN - h);
            h += from_hdr;
            p += n - from_hdr;
        }
        self.half.write_all(&payload[p..]).await
    }
}
