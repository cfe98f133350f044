//! Rank output: cut each child's stdout/stderr into lines, prefix them with
//! `[rank R] `, and write each line with one `write_all` from a single writer
//! thread per stream, so lines of different ranks never interleave.

use std::io::Write;
use std::thread::JoinHandle;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

/// A line longer than this is cut (each piece gets the prefix), so a rank
/// that never prints a newline cannot make chorus-run's memory grow.
pub(crate) const MAX_LINE: usize = 64 * 1024;

/// Cuts a byte stream into prefixed, newline-terminated lines.
#[derive(Debug)]
pub(crate) struct LineSplitter {
    prefix: Vec<u8>,
    line: Vec<u8>,
}

impl LineSplitter {
    pub(crate) fn new(prefix: Vec<u8>) -> LineSplitter {
        let line = prefix.clone();
        LineSplitter { prefix, line }
    }

    /// Feeds `bytes`; calls `emit` with every complete prefixed line.
    pub(crate) fn feed(&mut self, mut bytes: &[u8], emit: &mut impl FnMut(Vec<u8>)) {
        while !bytes.is_empty() {
            let room = MAX_LINE.saturating_sub(self.line.len() - self.prefix.len());
            let take = bytes.len().min(room.max(1));
            match bytes[..take].iter().position(|&b| b == b'\n') {
                Some(i) => {
                    self.line.extend_from_slice(&bytes[..=i]);
                    emit(self.take_line());
                    bytes = &bytes[i + 1..];
                }
                None => {
                    self.line.extend_from_slice(&bytes[..take]);
                    bytes = &bytes[take..];
                    if self.line.len() - self.prefix.len() >= MAX_LINE {
                        self.line.push(b'\n');
                        emit(self.take_line());
                    }
                }
            }
        }
    }

    /// End of stream: emits a last line that had no newline, adding one.
    pub(crate) fn finish(&mut self, emit: &mut impl FnMut(Vec<u8>)) {
        if self.line.len() > self.prefix.len() {
            self.line.push(b'\n');
            emit(self.take_line());
        }
    }

    fn take_line(&mut self) -> Vec<u8> {
        std::mem::replace(&mut self.line, self.prefix.clone())
    }
}

/// Which of chorus-run's own streams a writer owns.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

/// A thread that writes whole lines to chorus-run's stdout or stderr.
#[derive(Debug)]
pub(crate) struct Writer {
    tx: mpsc::Sender<Vec<u8>>,
    thread: JoinHandle<()>,
}

impl Writer {
    pub(crate) fn spawn(stream: Stream) -> std::io::Result<Writer> {
        // Bounded: a slow terminal slows the ranks down instead of growing
        // memory here.
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(1024);
        let thread = std::thread::Builder::new()
            .name(format!("chorus-run-{stream:?}").to_lowercase())
            .spawn(move || {
                let mut broken = false;
                while let Some(line) = rx.blocking_recv() {
                    // Once our own output is gone (closed pipe), keep
                    // draining so the ranks never block on a full pipe.
                    if !broken {
                        let r = match stream {
                            Stream::Stdout => write_line(&mut std::io::stdout().lock(), &line),
                            Stream::Stderr => write_line(&mut std::io::stderr().lock(), &line),
                        };
                        broken = r.is_err();
                    }
                }
            })?;
        Ok(Writer { tx, thread })
    }

    pub(crate) fn sender(&self) -> mpsc::Sender<Vec<u8>> {
        self.tx.clone()
    }

    /// Waits until every line sent so far is written. Every sender must be
    /// dropped first.
    pub(crate) fn close(self) {
        drop(self.tx);
        let _ = self.thread.join();
    }
}

fn write_line(w: &mut impl Write, line: &[u8]) -> std::io::Result<()> {
    w.write_all(line)?;
    w.flush()
}

/// Reads `src` to its end and sends each prefixed line to `tx`.
pub(crate) async fn pump<R: AsyncRead + Unpin>(
    mut src: R,
    prefix: Vec<u8>,
    tx: mpsc::Sender<Vec<u8>>,
) {
    let mut split = LineSplitter::new(prefix);
    let mut buf = vec![0u8; 16 * 1024];
    let mut lines = Vec::new();
    loop {
        let n = match src.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        split.feed(&buf[..n], &mut |l| lines.push(l));
        for l in lines.drain(..) {
            if tx.send(l).await.is_err() {
                return;
            }
        }
    }
    split.finish(&mut |l| lines.push(l));
    for l in lines.drain(..) {
        let _ = tx.send(l).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn split_all(chunks: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut s = LineSplitter::new(b"[rank 3] ".to_vec());
        let mut out = Vec::new();
        for c in chunks {
            s.feed(c, &mut |l| out.push(l));
        }
        s.finish(&mut |l| out.push(l));
        out
    }

    #[test]
    fn lines_are_prefixed_whatever_the_chunking() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let text: Vec<u8> = (0..5000)
            .map(|_| {
                if rng.gen_ratio(1, 20) {
                    b'\n'
                } else {
                    rng.gen_range(b'a'..=b'z')
                }
            })
            .collect();
        let expected: Vec<Vec<u8>> = text
            .split_inclusive(|&b| b == b'\n')
            .map(|l| {
                let mut v = b"[rank 3] ".to_vec();
                v.extend_from_slice(l);
                if !v.ends_with(b"\n") {
                    v.push(b'\n');
                }
                v
            })
            .collect();
        // Random chunk boundaries.
        let mut chunks = Vec::new();
        let mut rest = &text[..];
        while !rest.is_empty() {
            let n = rng.gen_range(1..=rest.len().min(300));
            chunks.push(&rest[..n]);
            rest = &rest[n..];
        }
        assert_eq!(split_all(&chunks), expected);
        assert_eq!(split_all(&[&text]), expected);
    }

    #[test]
    fn last_line_without_newline_is_terminated() {
        assert_eq!(
            split_all(&[b"a\nb", b"c"]),
            vec![b"[rank 3] a\n".to_vec(), b"[rank 3] bc\n".to_vec()]
        );
        assert!(split_all(&[b""]).is_empty());
    }

    #[test]
    fn overlong_lines_are_cut() {
        let long = vec![b'x'; MAX_LINE * 2 + 10];
        let out = split_all(&[&long, b"\n"]);
        assert_eq!(out.len(), 3);
        assert!(out
            .iter()
            .all(|l| l.starts_with(b"[rank 3] ") && l.ends_with(b"\n")));
        let total: usize = out.iter().map(|l| l.len() - b"[rank 3] ".len() - 1).sum();
        assert_eq!(total, long.len());
    }
}
