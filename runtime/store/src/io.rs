//! Socket buffers shared by the server and the client connections.
//!
//! A read that returns fewer bytes than offered has drained the socket; it
//! is reported to tokio as `WouldBlock` (through [`TcpStream::try_io`]),
//! which clears the socket's cached readiness, instead of spending one
//! more `recv` that would only return `WouldBlock`. Tokio clears only the
//! readiness event it saw before the read, so data that arrives later
//! still wakes the task. On the store's path every syscall counts.

use std::io;

use tokio::io::Interest;
use tokio::net::TcpStream;

use crate::wire;

/// Bytes waiting to be sent on a connection above which its task stops
/// taking more work (client: new requests; server: reading requests) until
/// the socket drains.
pub(crate) const OUT_HIGH_WATER: usize = 4 << 20;

/// Bytes offered to one `read` at least (unless the frame needs fewer).
const MIN_READ: usize = 4096;
/// Bytes offered to one `read` at most.
const READ_CHUNK: usize = 64 * 1024;
/// Capacity a buffer keeps while idle; more is given back.
const KEEP_CAPACITY: usize = 64 * 1024;

/// Incoming bytes. Grows only with bytes actually received (never with a
/// length a peer merely claims): at most the frame being read plus one
/// read chunk, twice over for the vector's growth.
#[derive(Debug, Default)]
pub(crate) struct InBuf {
    buf: Vec<u8>,
}

impl InBuf {
    /// The data not yet consumed.
    pub(crate) fn data(&self) -> &[u8] {
        &self.buf
    }

    /// True if no data is buffered.
    pub(crate) fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Drops the first `n` bytes of data.
    pub(crate) fn consume(&mut self, n: usize) {
        self.buf.drain(..n);
        if self.buf.is_empty() && self.buf.capacity() > KEEP_CAPACITY {
            self.buf.shrink_to(KEEP_CAPACITY);
        }
    }

    /// One read from a non-blocking socket outside tokio (the store
    /// client's caller side). Returns the bytes read (0 at EOF).
    ///
    /// # Errors
    ///
    /// The socket's error (`WouldBlock` if it holds nothing now).
    pub(crate) fn read_from(&mut self, sock: &mut impl io::Read) -> io::Result<usize> {
        let need = wire::missing_bytes(&self.buf).unwrap_or(0);
        let room = need.clamp(MIN_READ, READ_CHUNK);
        let len = self.buf.len();
        self.buf.resize(len + room, 0);
        let r = sock.read(&mut self.buf[len..]);
        self.buf.truncate(len + *r.as_ref().unwrap_or(&0));
        r
    }

    /// Reads while the socket has data (at most `max_reads` reads), calling
    /// `on_data` after each read that brought bytes. Returns true at EOF.
    ///
    /// # Errors
    ///
    /// The socket's error, or `on_data`'s.
    pub(crate) fn read_ready<E: From<io::Error>>(
        &mut self,
        sock: &TcpStream,
        max_reads: usize,
        mut on_data: impl FnMut(&mut Self) -> Result<(), E>,
    ) -> Result<bool, E> {
        for _ in 0..max_reads {
            let need = wire::missing_bytes(&self.buf).unwrap_or(0);
            self.buf.reserve(need.clamp(MIN_READ, READ_CHUNK));
            let room = self.buf.capacity() - self.buf.len();
            let mut short = false;
            let buf = &mut self.buf;
            let r = sock.try_io(Interest::READABLE, || match sock.try_read_buf(buf) {
                Ok(n) if n > 0 && n < room => {
                    // Drained: let tokio clear the readiness.
                    short = true;
                    Err(io::ErrorKind::WouldBlock.into())
                }
                other => other,
            });
            match r {
                _ if short => {
                    on_data(self)?;
                    return Ok(false);
                }
                Ok(0) => return Ok(true),
                Ok(_) => on_data(self)?,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(false)
    }
}

/// Outgoing bytes.
#[derive(Debug, Default)]
pub(crate) struct OutBuf {
    buf: Vec<u8>,
    pos: usize,
}

impl OutBuf {
    /// The buffer to append frames to.
    pub(crate) fn buf(&mut self) -> &mut Vec<u8> {
        &mut self.buf
    }

    /// Bytes not yet written.
    pub(crate) fn pending(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Writes as much as the socket takes now. Returns true once
    /// everything is written, false if the socket is full (then its
    /// `writable()` waits for room).
    ///
    /// # Errors
    ///
    /// The socket's error.
    pub(crate) fn flush(&mut self, sock: &TcpStream) -> io::Result<bool> {
        self.flush_with(|b| sock.try_write(b))
    }

    /// [`flush`](Self::flush) to a non-blocking socket outside tokio (the
    /// store client's caller side).
    ///
    /// # Errors
    ///
    /// The socket's error.
    pub(crate) fn flush_to(&mut self, sock: &mut impl io::Write) -> io::Result<bool> {
        self.flush_with(|b| sock.write(b))
    }

    fn flush_with(
        &mut self,
        mut write: impl FnMut(&[u8]) -> io::Result<usize>,
    ) -> io::Result<bool> {
        while self.pos < self.buf.len() {
            match write(&self.buf[self.pos..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Bytes appended while the socket is full must not pile
                    // up behind the ones already written.
                    if self.pos >= KEEP_CAPACITY {
                        self.buf.drain(..self.pos);
                        self.pos = 0;
                    }
                    return Ok(false);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.buf.clear();
        self.pos = 0;
        if self.buf.capacity() > KEEP_CAPACITY {
            self.buf.shrink_to(KEEP_CAPACITY);
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn memory_follows_bytes_received_not_lengths_claimed() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (s, _) = l.accept().await.unwrap();
        // A frame that claims the maximum length, of which 100 bytes come.
        let mut head = (wire::MAX_FRAME_LEN as u32).to_le_bytes().to_vec();
        head.extend_from_slice(&[wire::VERSION; 100]);
        c.write_all(&head).await.unwrap();
        let mut inb = InBuf::default();
        while inb.data().len() < head.len() {
            s.readable().await.unwrap();
            let eof = inb.read_ready(&s, 16, |_| Ok::<(), io::Error>(())).unwrap();
            assert!(!eof);
        }
        assert_eq!(inb.data(), &head[..]);
        assert!(
            inb.buf.capacity() <= 2 * READ_CHUNK,
            "{} bytes reserved for 104 received",
            inb.buf.capacity()
        );
        // Consumed data gives big buffers back.
        inb.buf.reserve(4 * KEEP_CAPACITY);
        inb.consume(inb.data().len());
        assert!(inb.buf.capacity() <= KEEP_CAPACITY);
    }
}
