//! The store's wire format: length-prefixed frames with a version byte.
//!
//! Every frame, in both directions, is
//!
//! ```text
//! u32 LE   len      bytes after this field, HEADER_LEN ..= MAX_FRAME_LEN
//! u8       version  VERSION
//! u8       kind     request opcode or response status
//! u64 LE   id       request id, echoed in the response (0 for errors that
//!                   belong to no request)
//! ...      body     fields below
//! ```
//!
//! Body fields: `bytes` = u32 LE length + data; `str` = `bytes` holding UTF-8;
//! `list<T>` = u32 LE count + items; `i64`/`u64` little-endian.
//!
//! Sizes are checked against the hard limits before anything is allocated:
//! the frame length as soon as its 4 bytes arrive, key and value lengths and
//! list counts before they are sliced or collected (a count can never exceed
//! what the frame's remaining bytes could hold).

use std::time::Duration;

use crate::error::StoreError;

/// Version byte of this wire format.
pub(crate) const VERSION: u8 = 1;

/// Longest key, in bytes.
pub const MAX_KEY_LEN: usize = 4096;
/// Longest value, in bytes.
pub const MAX_VALUE_LEN: usize = 8 << 20;
/// Longest frame (everything after the length prefix), in bytes.
pub const MAX_FRAME_LEN: usize = 16 << 20;
/// Most keys in one `wait`, `check`, `multi_get` or `multi_set`.
pub const MAX_KEYS_PER_OP: usize = 65_536;
/// Longest authentication token, in bytes.
pub const MAX_TOKEN_LEN: usize = 4096;
/// Longest frame a connection may send before it has authenticated.
pub(crate) const MAX_HELLO_FRAME_LEN: usize = 2 * MAX_TOKEN_LEN;

/// Bytes of the length prefix.
pub(crate) const LEN_PREFIX: usize = 4;
/// Bytes of version + kind + id.
pub(crate) const HEADER_LEN: usize = 10;

/// Request opcodes.
pub(crate) mod op {
    pub(crate) const HELLO: u8 = 1;
    pub(crate) const SET: u8 = 2;
    pub(crate) const GET: u8 = 3;
    pub(crate) const ADD: u8 = 4;
    pub(crate) const COMPARE_SET: u8 = 5;
    pub(crate) const WAIT: u8 = 6;
    pub(crate) const CHECK: u8 = 7;
    pub(crate) const DELETE: u8 = 8;
    pub(crate) const NUM_KEYS: u8 = 9;
    pub(crate) const MULTI_GET: u8 = 10;
    pub(crate) const MULTI_SET: u8 = 11;
    pub(crate) const PRESENT: u8 = 12;
}

/// Response statuses.
pub(crate) mod status {
    pub(crate) const OK: u8 = 0;
    pub(crate) const VALUE: u8 = 1;
    pub(crate) const INT: u8 = 2;
    pub(crate) const BOOL: u8 = 3;
    pub(crate) const VALUES: u8 = 4;
    pub(crate) const COUNT: u8 = 5;
    pub(crate) const ERROR: u8 = 0x80;
}

/// Error codes inside an `ERROR` response.
pub(crate) mod err {
    pub(crate) const TIMEOUT: u8 = 1;
    pub(crate) const AUTH: u8 = 2;
    pub(crate) const TOO_LARGE: u8 = 3;
    pub(crate) const PROTOCOL: u8 = 4;
    pub(crate) const INVALID_VALUE: u8 = 5;
}

/// What a frame header says, once its first bytes have arrived.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FrameStatus {
    /// Not enough bytes yet to know; read more.
    Partial,
    /// A complete frame of `total` bytes (prefix included) is at the front.
    Complete {
        /// Prefix + header + body.
        total: usize,
    },
}

/// Checks the frame at the front of `buf` without allocating: its length
/// against `max_len` as soon as the prefix is there, its version as soon as
/// that byte is there.
///
/// # Errors
///
/// [`StoreError::TooLarge`] for a length over `max_len`,
/// [`StoreError::Protocol`] for a length shorter than a header or a
/// version other than [`VERSION`].
pub(crate) fn check_frame(buf: &[u8], max_len: usize) -> Result<FrameStatus, StoreError> {
    let Some(prefix) = buf.get(..LEN_PREFIX) else {
        return Ok(FrameStatus::Partial);
    };
    let len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
    if len > max_len {
        return Err(StoreError::TooLarge {
            what: "frame",
            len,
            limit: max_len,
        });
    }
    if len < HEADER_LEN {
        return Err(StoreError::Protocol(format!(
            "frame length {len} is shorter than the {HEADER_LEN}-byte header"
        )));
    }
    if let Some(&v) = buf.get(LEN_PREFIX) {
        if v != VERSION {
            return Err(StoreError::Protocol(format!(
                "wire version {v}, this side speaks version {VERSION}; run the same chorus version on every rank"
            )));
        }
    }
    if buf.len() < LEN_PREFIX + len {
        return Ok(FrameStatus::Partial);
    }
    Ok(FrameStatus::Complete {
        total: LEN_PREFIX + len,
    })
}

/// How many more bytes the frame at the front of `buf` needs, if known.
pub(crate) fn missing_bytes(buf: &[u8]) -> Option<usize> {
    let prefix = buf.get(..LEN_PREFIX)?;
    let len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
    Some((LEN_PREFIX + len).saturating_sub(buf.len()))
}

/// Splits a complete frame (prefix included) into kind, id and body.
pub(crate) fn split_frame(frame: &[u8]) -> (u8, u64, &[u8]) {
    // check_frame guaranteed at least LEN_PREFIX + HEADER_LEN bytes.
    let kind = frame[LEN_PREFIX + 1];
    let mut id = [0u8; 8];
    id.copy_from_slice(&frame[LEN_PREFIX + 2..LEN_PREFIX + HEADER_LEN]);
    (
        kind,
        u64::from_le_bytes(id),
        &frame[LEN_PREFIX + HEADER_LEN..],
    )
}

// ---------------------------------------------------------------- encoding

/// Appends frames to a buffer: `begin`, fields, `finish`.
#[derive(Debug)]
pub(crate) struct Encoder<'a> {
    buf: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Encoder<'a> {
    /// Starts a frame of `kind` for request `id` at the end of `buf`.
    pub(crate) fn begin(buf: &'a mut Vec<u8>, kind: u8, id: u64) -> Self {
        let start = buf.len();
        buf.extend_from_slice(&[0, 0, 0, 0, VERSION, kind]);
        buf.extend_from_slice(&id.to_le_bytes());
        Encoder { buf, start }
    }

    /// Appends length-prefixed bytes.
    pub(crate) fn bytes(&mut self, b: &[u8]) -> &mut Self {
        // Callers check lengths against the limits (all far below u32::MAX).
        self.buf.extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(b);
        self
    }

    /// Appends a u32 count.
    pub(crate) fn count(&mut self, n: usize) -> &mut Self {
        self.buf.extend_from_slice(&(n as u32).to_le_bytes());
        self
    }

    /// Appends a little-endian u64.
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a little-endian i64.
    pub(crate) fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends one byte.
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }

    /// Appends a timeout as whole milliseconds (rounded up, saturating).
    pub(crate) fn timeout(&mut self, d: Duration) -> &mut Self {
        let ms = d.as_nanos().div_ceil(1_000_000);
        self.u64(u64::try_from(ms).unwrap_or(u64::MAX))
    }

    /// Writes the length prefix. Returns the frame's length (prefix
    /// included), which the caller checks against [`MAX_FRAME_LEN`].
    pub(crate) fn finish(self) -> usize {
        let total = self.buf.len() - self.start;
        let len = (total - LEN_PREFIX) as u32;
        self.buf[self.start..self.start + LEN_PREFIX].copy_from_slice(&len.to_le_bytes());
        total
    }
}

/// Checks a key's length.
///
/// # Errors
///
/// [`StoreError::TooLarge`] over [`MAX_KEY_LEN`].
pub(crate) fn check_key(key: &str) -> Result<(), StoreError> {
    if key.len() > MAX_KEY_LEN {
        return Err(StoreError::TooLarge {
            what: "key",
            len: key.len(),
            limit: MAX_KEY_LEN,
        });
    }
    Ok(())
}

/// Checks a value's length.
///
/// # Errors
///
/// [`StoreError::TooLarge`] over [`MAX_VALUE_LEN`].
pub(crate) fn check_value(value: &[u8]) -> Result<(), StoreError> {
    if value.len() > MAX_VALUE_LEN {
        return Err(StoreError::TooLarge {
            what: "value",
            len: value.len(),
            limit: MAX_VALUE_LEN,
        });
    }
    Ok(())
}

/// Checks a key list's length and every key in it.
///
/// # Errors
///
/// [`StoreError::TooLarge`] over [`MAX_KEYS_PER_OP`] keys or for a key
/// over [`MAX_KEY_LEN`].
pub(crate) fn check_keys<'k>(
    n: usize,
    keys: impl IntoIterator<Item = &'k str>,
) -> Result<(), StoreError> {
    if n > MAX_KEYS_PER_OP {
        return Err(StoreError::TooLarge {
            what: "key list",
            len: n,
            limit: MAX_KEYS_PER_OP,
        });
    }
    keys.into_iter().try_for_each(check_key)
}

// ---------------------------------------------------------------- decoding

/// Reads fields off a frame body, checking every length against what is
/// left and against the limits before slicing.
#[derive(Debug)]
pub(crate) struct Decoder<'a> {
    rest: &'a [u8],
}

fn malformed(what: &str) -> StoreError {
    StoreError::Protocol(format!("malformed frame: {what}"))
}

impl<'a> Decoder<'a> {
    /// Reads `body`.
    pub(crate) fn new(body: &'a [u8]) -> Self {
        Decoder { rest: body }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], StoreError> {
        if self.rest.len() < n {
            return Err(malformed(&format!(
                "{what} needs {n} bytes, {} left in the frame",
                self.rest.len()
            )));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u32(&mut self, what: &str) -> Result<usize, StoreError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }

    /// Reads a little-endian u64.
    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, StoreError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// Reads a little-endian i64.
    pub(crate) fn i64(&mut self, what: &str) -> Result<i64, StoreError> {
        Ok(self.u64(what)? as i64)
    }

    /// Reads one byte.
    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, StoreError> {
        Ok(self.take(1, what)?[0])
    }

    /// Reads length-prefixed bytes of at most `limit` bytes.
    pub(crate) fn bytes(
        &mut self,
        what: &'static str,
        limit: usize,
    ) -> Result<&'a [u8], StoreError> {
        let n = self.u32(what)?;
        if n > limit {
            return Err(StoreError::TooLarge {
                what,
                len: n,
                limit,
            });
        }
        self.take(n, what)
    }

    /// Reads a key.
    pub(crate) fn key(&mut self) -> Result<&'a str, StoreError> {
        let b = self.bytes("key", MAX_KEY_LEN)?;
        std::str::from_utf8(b).map_err(|_| malformed("key is not UTF-8"))
    }

    /// Reads a value.
    pub(crate) fn value(&mut self) -> Result<&'a [u8], StoreError> {
        self.bytes("value", MAX_VALUE_LEN)
    }

    /// Reads a list count, at most `limit` and at most what the rest of
    /// the frame could hold at `min_item` bytes an item.
    pub(crate) fn count(&mut self, limit: usize, min_item: usize) -> Result<usize, StoreError> {
        let n = self.u32("list count")?;
        if n > limit {
            return Err(StoreError::TooLarge {
                what: "key list",
                len: n,
                limit,
            });
        }
        if n.saturating_mul(min_item) > self.rest.len() {
            return Err(malformed(&format!(
                "list of {n} items cannot fit in the {} bytes left",
                self.rest.len()
            )));
        }
        Ok(n)
    }

    /// Reads a list of keys.
    pub(crate) fn keys(&mut self) -> Result<Vec<&'a str>, StoreError> {
        let n = self.count(MAX_KEYS_PER_OP, 4)?;
        (0..n).map(|_| self.key()).collect()
    }

    /// Reads a timeout in milliseconds.
    pub(crate) fn timeout(&mut self) -> Result<Duration, StoreError> {
        Ok(Duration::from_millis(self.u64("timeout")?))
    }

    /// Fails unless the whole body was read.
    pub(crate) fn end(&self) -> Result<(), StoreError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(malformed(&format!(
                "{} unexpected bytes after the last field",
                self.rest.len()
            )))
        }
    }
}

// ---------------------------------------------------------------- requests

/// A decoded request, borrowing from the frame.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Request<'a> {
    Hello {
        token: &'a [u8],
    },
    Set {
        key: &'a str,
        value: &'a [u8],
    },
    Get {
        key: &'a str,
        timeout: Duration,
    },
    Add {
        key: &'a str,
        delta: i64,
    },
    CompareSet {
        key: &'a str,
        expected: &'a [u8],
        desired: &'a [u8],
    },
    Wait {
        keys: Vec<&'a str>,
        timeout: Duration,
    },
    Check {
        keys: Vec<&'a str>,
    },
    /// Which of the keys exist: a `VALUE` reply of one byte (0 or 1) per
    /// key.
    Present {
        keys: Vec<&'a str>,
    },
    Delete {
        key: &'a str,
    },
    NumKeys {
        prefix: &'a str,
    },
    MultiGet {
        keys: Vec<&'a str>,
        timeout: Duration,
    },
    MultiSet {
        entries: Vec<(&'a str, &'a [u8])>,
    },
}

impl<'a> Request<'a> {
    /// Decodes a request body of opcode `kind`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Protocol`] for an unknown opcode or a malformed body,
    /// [`StoreError::TooLarge`] for a field over its limit.
    pub(crate) fn decode(kind: u8, body: &'a [u8]) -> Result<Self, StoreError> {
        let mut d = Decoder::new(body);
        let req = match kind {
            op::HELLO => Request::Hello {
                token: d.bytes("token", MAX_TOKEN_LEN)?,
            },
            op::SET => Request::Set {
                key: d.key()?,
                value: d.value()?,
            },
            op::GET => Request::Get {
                key: d.key()?,
                timeout: d.timeout()?,
            },
            op::ADD => Request::Add {
                key: d.key()?,
                delta: d.i64("delta")?,
            },
            op::COMPARE_SET => Request::CompareSet {
                key: d.key()?,
                expected: d.value()?,
                desired: d.value()?,
            },
            op::WAIT => Request::Wait {
                keys: d.keys()?,
                timeout: d.timeout()?,
            },
            op::CHECK => Request::Check { keys: d.keys()? },
            op::PRESENT => Request::Present { keys: d.keys()? },
            op::DELETE => Request::Delete { key: d.key()? },
            op::NUM_KEYS => Request::NumKeys { prefix: d.key()? },
            op::MULTI_GET => Request::MultiGet {
                keys: d.keys()?,
                timeout: d.timeout()?,
            },
            op::MULTI_SET => {
                let n = d.count(MAX_KEYS_PER_OP, 8)?;
                let entries = (0..n)
                    .map(|_| Ok((d.key()?, d.value()?)))
                    .collect::<Result<Vec<_>, StoreError>>()?;
                Request::MultiSet { entries }
            }
            other => {
                return Err(StoreError::Protocol(format!("unknown opcode {other}")));
            }
        };
        d.end()?;
        Ok(req)
    }
}

// ---------------------------------------------------------------- responses

/// A decoded response.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    Ok,
    Value(Vec<u8>),
    Int(i64),
    Bool(bool),
    Values(Vec<Vec<u8>>),
    Count(u64),
    Error(WireError),
}

/// An error sent by the server; the client completes it with what it
/// knows of its own request (keys, timeout).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WireError {
    /// These keys were still missing at the timeout.
    Timeout(Vec<String>),
    Auth(String),
    TooLarge {
        what: String,
        len: u64,
        limit: u64,
    },
    Protocol(String),
    InvalidValue {
        key: String,
        msg: String,
    },
}

/// Appends an error response for request `id` to `buf`.
pub(crate) fn encode_error(buf: &mut Vec<u8>, id: u64, e: &StoreError) {
    let mut enc = Encoder::begin(buf, status::ERROR, id);
    match e {
        StoreError::Timeout { keys, .. } => {
            enc.u8(err::TIMEOUT).count(keys.len());
            for k in keys {
                enc.bytes(k.as_bytes());
            }
        }
        StoreError::Auth(m) => {
            enc.u8(err::AUTH).bytes(m.as_bytes());
        }
        StoreError::TooLarge { what, len, limit } => {
            enc.u8(err::TOO_LARGE)
                .bytes(what.as_bytes())
                .u64(*len as u64)
                .u64(*limit as u64);
        }
        StoreError::InvalidValue { key, msg } => {
            enc.u8(err::INVALID_VALUE)
                .bytes(key.as_bytes())
                .bytes(msg.as_bytes());
        }
        other => {
            enc.u8(err::PROTOCOL).bytes(other.to_string().as_bytes());
        }
    }
    enc.finish();
}

/// Longest error message or name field accepted in a reply.
const MAX_MSG_LEN: usize = 64 * 1024;

fn string(d: &mut Decoder<'_>, what: &'static str, limit: usize) -> Result<String, StoreError> {
    Ok(String::from_utf8_lossy(d.bytes(what, limit)?).into_owned())
}

impl Reply {
    /// Decodes a response body of status `kind`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Protocol`] for an unknown status or a malformed body.
    pub(crate) fn decode(kind: u8, body: &[u8]) -> Result<Self, StoreError> {
        let mut d = Decoder::new(body);
        let reply = match kind {
            status::OK => Reply::Ok,
            status::VALUE => Reply::Value(d.value()?.to_vec()),
            status::INT => Reply::Int(d.i64("int")?),
            status::BOOL => Reply::Bool(d.u8("bool")? != 0),
            status::COUNT => Reply::Count(d.u64("count")?),
            status::VALUES => {
                let n = d.count(MAX_KEYS_PER_OP, 4)?;
                Reply::Values(
                    (0..n)
                        .map(|_| d.value().map(<[u8]>::to_vec))
                        .collect::<Result<_, _>>()?,
                )
            }
            status::ERROR => Reply::Error(match d.u8("error code")? {
                err::TIMEOUT => {
                    let n = d.count(MAX_KEYS_PER_OP, 4)?;
                    WireError::Timeout(
                        (0..n)
                            .map(|_| string(&mut d, "key", MAX_KEY_LEN))
                            .collect::<Result<_, _>>()?,
                    )
                }
                err::AUTH => WireError::Auth(string(&mut d, "message", MAX_MSG_LEN)?),
                err::TOO_LARGE => WireError::TooLarge {
                    what: string(&mut d, "name", MAX_MSG_LEN)?,
                    len: d.u64("len")?,
                    limit: d.u64("limit")?,
                },
                err::INVALID_VALUE => WireError::InvalidValue {
                    key: string(&mut d, "key", MAX_KEY_LEN)?,
                    msg: string(&mut d, "message", MAX_MSG_LEN)?,
                },
                err::PROTOCOL => WireError::Protocol(string(&mut d, "message", MAX_MSG_LEN)?),
                other => WireError::Protocol(format!("unknown error code {other}")),
            }),
            other => {
                return Err(StoreError::Protocol(format!(
                    "unknown response status {other}"
                )))
            }
        };
        d.end()?;
        Ok(reply)
    }
}

impl WireError {
    /// The error as the client reports it, given the timeout it asked for.
    pub(crate) fn into_store_error(self, timeout: Duration) -> StoreError {
        match self {
            WireError::Timeout(keys) => StoreError::Timeout {
                keys,
                after: timeout,
            },
            WireError::Auth(m) => StoreError::Auth(m),
            WireError::TooLarge { what, len, limit } => StoreError::TooLarge {
                what: static_name(&what),
                len: usize::try_from(len).unwrap_or(usize::MAX),
                limit: usize::try_from(limit).unwrap_or(usize::MAX),
            },
            WireError::Protocol(m) => StoreError::Protocol(format!("server said: {m}")),
            WireError::InvalidValue { key, msg } => StoreError::InvalidValue { key, msg },
        }
    }
}

/// Maps a limit's name back to the `&'static str` [`StoreError::TooLarge`]
/// carries.
fn static_name(what: &str) -> &'static str {
    match what {
        "key" => "key",
        "value" => "value",
        "frame" => "frame",
        "key list" => "key list",
        "token" => "token",
        _ => "field",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, id: u64, f: impl FnOnce(&mut Encoder<'_>)) -> Vec<u8> {
        let mut buf = Vec::new();
        let mut enc = Encoder::begin(&mut buf, kind, id);
        f(&mut enc);
        enc.finish();
        buf
    }

    fn decode_req(buf: &[u8]) -> Result<(u64, Request<'_>), StoreError> {
        match check_frame(buf, MAX_FRAME_LEN)? {
            FrameStatus::Complete { total } => {
                assert_eq!(total, buf.len());
                let (kind, id, body) = split_frame(buf);
                Ok((id, Request::decode(kind, body)?))
            }
            FrameStatus::Partial => panic!("partial"),
        }
    }

    #[test]
    fn request_round_trip() {
        let buf = frame(op::SET, 77, |e| {
            e.bytes(b"k1").bytes(&[1, 2, 3]);
        });
        assert_eq!(
            decode_req(&buf).unwrap(),
            (
                77,
                Request::Set {
                    key: "k1",
                    value: &[1, 2, 3]
                }
            )
        );
        let buf = frame(op::MULTI_SET, 3, |e| {
            e.count(2).bytes(b"a").bytes(b"x").bytes(b"b").bytes(b"");
        });
        assert_eq!(
            decode_req(&buf).unwrap().1,
            Request::MultiSet {
                entries: vec![("a", &b"x"[..]), ("b", &b""[..])]
            }
        );
        let buf = frame(op::WAIT, 9, |e| {
            e.count(1).bytes(b"z").timeout(Duration::from_micros(1500));
        });
        assert_eq!(
            decode_req(&buf).unwrap().1,
            Request::Wait {
                keys: vec!["z"],
                timeout: Duration::from_millis(2)
            }
        );
    }

    #[test]
    fn every_prefix_of_a_frame_is_partial() {
        let buf = frame(op::CHECK, 1, |e| {
            e.count(2).bytes(b"alpha").bytes(b"beta");
        });
        for n in 0..buf.len() {
            assert_eq!(
                check_frame(&buf[..n], MAX_FRAME_LEN).unwrap(),
                FrameStatus::Partial,
                "prefix of {n} bytes"
            );
        }
    }

    #[test]
    fn oversize_length_is_rejected_from_the_prefix_alone() {
        let buf = (u32::MAX).to_le_bytes();
        assert!(matches!(
            check_frame(&buf, MAX_FRAME_LEN),
            Err(StoreError::TooLarge { what: "frame", .. })
        ));
        let buf = ((MAX_FRAME_LEN + 1) as u32).to_le_bytes();
        assert!(check_frame(&buf, MAX_FRAME_LEN).is_err());
        let buf = 3u32.to_le_bytes();
        assert!(matches!(
            check_frame(&buf, MAX_FRAME_LEN),
            Err(StoreError::Protocol(_))
        ));
    }

    #[test]
    fn wrong_version_is_rejected_early() {
        let mut buf = 100u32.to_le_bytes().to_vec();
        buf.push(VERSION + 1);
        assert!(matches!(
            check_frame(&buf, MAX_FRAME_LEN),
            Err(StoreError::Protocol(_))
        ));
    }

    #[test]
    fn lying_lengths_and_counts_are_rejected() {
        // Key length larger than the frame.
        let buf = frame(op::GET, 1, |e| {
            e.count(1000).u64(5);
        });
        assert!(decode_req(&buf).is_err());
        // Key length over the limit.
        let buf = frame(op::DELETE, 1, |e| {
            e.count(MAX_KEY_LEN + 1);
        });
        assert!(matches!(
            decode_req(&buf),
            Err(StoreError::TooLarge { what: "key", .. })
        ));
        // A count that cannot fit.
        let buf = frame(op::CHECK, 1, |e| {
            e.count(60_000);
        });
        assert!(decode_req(&buf).is_err());
        // Trailing bytes.
        let buf = frame(op::DELETE, 1, |e| {
            e.bytes(b"k").u8(0);
        });
        assert!(decode_req(&buf).is_err());
        // Unknown opcode.
        let buf = frame(200, 1, |_| {});
        assert!(decode_req(&buf).is_err());
        // Key that is not UTF-8.
        let buf = frame(op::DELETE, 1, |e| {
            e.bytes(&[0xff, 0xfe]);
        });
        assert!(decode_req(&buf).is_err());
    }

    #[test]
    fn random_bodies_never_panic() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..20_000 {
            let len = rng.gen_range(0..64);
            let body: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            let kind = rng.gen_range(0..16);
            let _ = Request::decode(kind, &body);
            let _ = Reply::decode(kind, &body);
            let _ = Reply::decode(status::ERROR, &body);
        }
    }

    #[test]
    fn error_round_trip() {
        let mut buf = Vec::new();
        encode_error(
            &mut buf,
            5,
            &StoreError::Timeout {
                keys: vec!["a".into(), "b".into()],
                after: Duration::from_secs(1),
            },
        );
        let FrameStatus::Complete { total } = check_frame(&buf, MAX_FRAME_LEN).unwrap() else {
            panic!("partial")
        };
        let (kind, id, body) = split_frame(&buf[..total]);
        assert_eq!(id, 5);
        assert_eq!(
            Reply::decode(kind, body).unwrap(),
            Reply::Error(WireError::Timeout(vec!["a".into(), "b".into()]))
        );
    }
}
