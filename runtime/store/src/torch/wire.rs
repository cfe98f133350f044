//! PyTorch's TCPStore wire protocol, as its client and its libuv server
//! speak it (c10d, PyTorch 2.x): an I/O-free codec.
//!
//! There are no frames. A request is one query byte followed by its fields;
//! a reply has no header at all, so a client must know which reply each
//! request gets (or none) and read them in order. Fields are in the host's
//! byte order, which is little-endian on every machine PyTorch ships for:
//!
//! ```text
//! string / bytes   u64 length, then the bytes
//! key list         u64 count, then that many strings
//! i64, u32         8 / 4 bytes
//! ```
//!
//! | query | fields | reply |
//! |---|---|---|
//! | `VALIDATE` 0 | u32 magic `0x3C85F7CE` | none |
//! | `SET` 1 | key, value | none |
//! | `COMPARE_SET` 2 | key, expected, desired | bytes: the value now stored |
//! | `GET` 3 | key | bytes (empty when missing) |
//! | `ADD` 4 | key, i64 delta | i64: the new value |
//! | `CHECK` 5 | key list | u8: 0 all exist, 1 not all |
//! | `WAIT` 6 | key list | u8 0, once every key exists |
//! | `GETNUMKEYS` 7 | — | i64 |
//! | `DELETE_KEY` 8 | key | i64: keys deleted (0 or 1) |
//! | `MULTI_GET` 10 | key list | bytes per key (empty when missing) |
//! | `MULTI_SET` 11 | u64 count, then key and value per entry | none |
//! | `CANCEL_WAIT` 12 | — | u8 1, after any `WAIT` reply already sent |
//! | `PING` 13 | u32 nonce | u32: the nonce |
//!
//! A connection must send `VALIDATE` first; until it has, the server
//! ignores everything else. The libuv server refuses (by closing the
//! connection) a key over 8 KiB, a value over 8 MiB and a key list over
//! 128 Ki keys; an `ADD` to a value that is not a decimal integer closes
//! the connection too. chorus's own limits ([`MAX_KEY_LEN`],
//! [`MAX_VALUE_LEN`], [`MAX_KEYS_PER_OP`]) are the same or stricter, and a
//! request over [`MAX_FRAME_LEN`] in all is refused before it is sent.
//!
//! Replies are decoded from a byte slice that may hold only part of them:
//! [`decode`] says how many bytes one complete reply took, or that more are
//! needed, and checks every length against the limits before it allocates.

use crate::error::StoreError;
use crate::wire::{check_key, check_keys, check_value, MAX_FRAME_LEN, MAX_VALUE_LEN};

/// The number a client sends with `VALIDATE`.
pub(crate) const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

/// Query bytes.
mod query {
    pub(super) const VALIDATE: u8 = 0;
    pub(super) const SET: u8 = 1;
    pub(super) const COMPARE_SET: u8 = 2;
    pub(super) const GET: u8 = 3;
    pub(super) const ADD: u8 = 4;
    pub(super) const CHECK: u8 = 5;
    pub(super) const WAIT: u8 = 6;
    pub(super) const GETNUMKEYS: u8 = 7;
    pub(super) const DELETE_KEY: u8 = 8;
    pub(super) const MULTI_GET: u8 = 10;
    pub(super) const MULTI_SET: u8 = 11;
    pub(super) const CANCEL_WAIT: u8 = 12;
    pub(super) const PING: u8 = 13;
}

/// `CHECK`'s reply when every key exists.
const CHECK_READY: u8 = 0;
/// `CHECK`'s reply when some key is missing.
const CHECK_NOT_READY: u8 = 1;
/// `WAIT`'s reply once every key exists.
pub(crate) const STOP_WAITING: u8 = 0;
/// `CANCEL_WAIT`'s reply.
pub(crate) const WAIT_CANCELED: u8 = 1;

/// One request.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Query<'a> {
    Validate,
    Ping(u32),
    Set(&'a str, &'a [u8]),
    CompareSet(&'a str, &'a [u8], &'a [u8]),
    Get(&'a str),
    Add(&'a str, i64),
    Check(&'a [&'a str]),
    Wait(&'a [&'a str]),
    NumKeys,
    Delete(&'a str),
    MultiGet(&'a [&'a str]),
    MultiSet(&'a [(&'a str, &'a [u8])]),
    CancelWait,
}

/// The reply a query gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expect {
    /// No reply.
    Nothing,
    /// A u32 (`PING`).
    U32,
    /// An i64 (`ADD`, `GETNUMKEYS`, `DELETE_KEY`).
    I64,
    /// One byte (`CHECK`, `WAIT`, `CANCEL_WAIT`).
    Byte,
    /// One value (`GET`, `COMPARE_SET`).
    Bytes,
    /// This many values (`MULTI_GET`).
    Values(usize),
}

/// A decoded reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    U32(u32),
    I64(i64),
    Byte(u8),
    Bytes(Vec<u8>),
    Values(Vec<Vec<u8>>),
}

impl Answer {
    pub(crate) fn into_u32(self) -> Result<u32, StoreError> {
        match self {
            Answer::U32(v) => Ok(v),
            a => Err(mismatch("u32", &a)),
        }
    }
    pub(crate) fn into_i64(self) -> Result<i64, StoreError> {
        match self {
            Answer::I64(v) => Ok(v),
            a => Err(mismatch("i64", &a)),
        }
    }
    pub(crate) fn into_byte(self) -> Result<u8, StoreError> {
        match self {
            Answer::Byte(v) => Ok(v),
            a => Err(mismatch("byte", &a)),
        }
    }
    pub(crate) fn into_bytes(self) -> Result<Vec<u8>, StoreError> {
        match self {
            Answer::Bytes(v) => Ok(v),
            a => Err(mismatch("value", &a)),
        }
    }
    pub(crate) fn into_values(self) -> Result<Vec<Vec<u8>>, StoreError> {
        match self {
            Answer::Values(v) => Ok(v),
            a => Err(mismatch("value list", &a)),
        }
    }
}

fn mismatch(want: &str, got: &Answer) -> StoreError {
    StoreError::Protocol(format!(
        "PyTorch TCPStore reply: expected a {want}, decoded {got:?}"
    ))
}

/// What `CHECK` answered: true if every key exists.
pub(crate) fn check_ready(byte: u8) -> Result<bool, StoreError> {
    match byte {
        CHECK_READY => Ok(true),
        CHECK_NOT_READY => Ok(false),
        b => Err(StoreError::Protocol(format!(
            "PyTorch TCPStore CHECK reply {b} is neither READY (0) nor NOT_READY (1)"
        ))),
    }
}

fn put_len(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(&(n as u64).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_len(out, b.len());
    out.extend_from_slice(b);
}

fn put_keys(out: &mut Vec<u8>, keys: &[&str]) {
    put_len(out, keys.len());
    for k in keys {
        put_bytes(out, k.as_bytes());
    }
}

fn keys_size(keys: &[&str]) -> usize {
    8 + keys.iter().map(|k| 8 + k.len()).sum::<usize>()
}

impl Query<'_> {
    /// Checks the request against the limits: every key, every value, the
    /// key count and the request's total size.
    ///
    /// # Errors
    ///
    /// [`StoreError::TooLarge`] naming what is over its limit.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        match *self {
            Query::Validate | Query::Ping(_) | Query::NumKeys | Query::CancelWait => {}
            Query::Set(k, v) => {
                check_key(k)?;
                check_value(v)?;
            }
            Query::CompareSet(k, e, d) => {
                check_key(k)?;
                check_value(e)?;
                check_value(d)?;
            }
            Query::Get(k) | Query::Add(k, _) | Query::Delete(k) => check_key(k)?,
            Query::Check(keys) | Query::Wait(keys) | Query::MultiGet(keys) => {
                check_keys(keys.len(), keys.iter().copied())?;
            }
            Query::MultiSet(entries) => {
                check_keys(entries.len(), entries.iter().map(|e| e.0))?;
                entries.iter().try_for_each(|e| check_value(e.1))?;
            }
        }
        let len = self.encoded_len();
        if len > MAX_FRAME_LEN {
            return Err(StoreError::TooLarge {
                what: "request",
                len,
                limit: MAX_FRAME_LEN,
            });
        }
        Ok(())
    }

    /// Bytes [`encode`](Self::encode) appends.
    pub(crate) fn encoded_len(&self) -> usize {
        1 + match *self {
            Query::Validate | Query::Ping(_) => 4,
            Query::NumKeys | Query::CancelWait => 0,
            Query::Set(k, v) => 16 + k.len() + v.len(),
            Query::CompareSet(k, e, d) => 24 + k.len() + e.len() + d.len(),
            Query::Get(k) | Query::Delete(k) => 8 + k.len(),
            Query::Add(k, _) => 16 + k.len(),
            Query::Check(keys) | Query::Wait(keys) | Query::MultiGet(keys) => keys_size(keys),
            Query::MultiSet(entries) => {
                8 + entries
                    .iter()
                    .map(|(k, v)| 16 + k.len() + v.len())
                    .sum::<usize>()
            }
        }
    }

    /// Appends the request's bytes to `out`. Call [`check`](Self::check)
    /// first: encoding does not check limits.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.reserve(self.encoded_len());
        match *self {
            Query::Validate => {
                out.push(query::VALIDATE);
                out.extend_from_slice(&VALIDATION_MAGIC.to_le_bytes());
            }
            Query::Ping(nonce) => {
                out.push(query::PING);
                out.extend_from_slice(&nonce.to_le_bytes());
            }
            Query::Set(k, v) => {
                out.push(query::SET);
                put_bytes(out, k.as_bytes());
                put_bytes(out, v);
            }
            Query::CompareSet(k, e, d) => {
                out.push(query::COMPARE_SET);
                put_bytes(out, k.as_bytes());
                put_bytes(out, e);
                put_bytes(out, d);
            }
            Query::Get(k) => {
                out.push(query::GET);
                put_bytes(out, k.as_bytes());
            }
            Query::Add(k, delta) => {
                out.push(query::ADD);
                put_bytes(out, k.as_bytes());
                out.extend_from_slice(&delta.to_le_bytes());
            }
            Query::Check(keys) => {
                out.push(query::CHECK);
                put_keys(out, keys);
            }
            Query::Wait(keys) => {
                out.push(query::WAIT);
                put_keys(out, keys);
            }
            Query::NumKeys => out.push(query::GETNUMKEYS),
            Query::Delete(k) => {
                out.push(query::DELETE_KEY);
                put_bytes(out, k.as_bytes());
            }
            Query::MultiGet(keys) => {
                out.push(query::MULTI_GET);
                put_keys(out, keys);
            }
            Query::MultiSet(entries) => {
                out.push(query::MULTI_SET);
                put_len(out, entries.len());
                for (k, v) in entries {
                    put_bytes(out, k.as_bytes());
                    put_bytes(out, v);
                }
            }
            Query::CancelWait => out.push(query::CANCEL_WAIT),
        }
    }

    /// The reply this request gets.
    pub(crate) fn expect(&self) -> Expect {
        match *self {
            Query::Validate | Query::Set(..) | Query::MultiSet(_) => Expect::Nothing,
            Query::Ping(_) => Expect::U32,
            Query::Add(..) | Query::NumKeys | Query::Delete(_) => Expect::I64,
            Query::Check(_) | Query::Wait(_) | Query::CancelWait => Expect::Byte,
            Query::Get(_) | Query::CompareSet(..) => Expect::Bytes,
            Query::MultiGet(keys) => Expect::Values(keys.len()),
        }
    }
}

/// Reads fixed-size and length-prefixed fields off the front of `buf`;
/// `None` when `buf` ends first.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let s = self.buf.get(self.at..end)?;
        self.at = end;
        Some(s)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N).and_then(|s| s.try_into().ok())
    }

    /// The length of the next value, checked against [`MAX_VALUE_LEN`]
    /// before anything is allocated.
    fn value_len(&mut self) -> Result<Option<usize>, StoreError> {
        let Some(raw) = self.array::<8>() else {
            return Ok(None);
        };
        let len = u64::from_le_bytes(raw);
        match usize::try_from(len) {
            Ok(len) if len <= MAX_VALUE_LEN => Ok(Some(len)),
            _ => Err(StoreError::TooLarge {
                what: "value in a PyTorch TCPStore reply",
                len: usize::try_from(len).unwrap_or(usize::MAX),
                limit: MAX_VALUE_LEN,
            }),
        }
    }

    fn value(&mut self) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(len) = self.value_len()? else {
            return Ok(None);
        };
        Ok(self.take(len).map(<[u8]>::to_vec))
    }
}

/// Decodes one reply of kind `expect` off the front of `buf`.
///
/// Returns the reply and the bytes it took, or `None` if `buf` does not
/// hold all of it yet. [`Expect::Nothing`] decodes nothing: do not call it
/// for requests without a reply.
///
/// # Errors
///
/// [`StoreError::TooLarge`] for a value over [`MAX_VALUE_LEN`] or a value
/// list over [`MAX_FRAME_LEN`] in all, detected from the lengths before
/// any of it is copied.
pub(crate) fn decode(expect: Expect, buf: &[u8]) -> Result<Option<(Answer, usize)>, StoreError> {
    let mut r = Reader { buf, at: 0 };
    let answer = match expect {
        Expect::Nothing => {
            return Err(StoreError::Protocol(
                "a PyTorch TCPStore request without a reply has nothing to decode".into(),
            ))
        }
        Expect::U32 => r.array::<4>().map(|b| Answer::U32(u32::from_le_bytes(b))),
        Expect::I64 => r.array::<8>().map(|b| Answer::I64(i64::from_le_bytes(b))),
        Expect::Byte => r.array::<1>().map(|b| Answer::Byte(b[0])),
        Expect::Bytes => r.value()?.map(Answer::Bytes),
        Expect::Values(n) => {
            // Walk the lengths first: nothing is copied until the whole
            // reply is here and within the limit.
            let mut total = 0usize;
            for _ in 0..n {
                let Some(len) = r.value_len()? else {
                    return Ok(None);
                };
                total = total.saturating_add(8 + len);
                if total > MAX_FRAME_LEN {
                    return Err(StoreError::TooLarge {
                        what: "PyTorch TCPStore multi_get reply",
                        len: total,
                        limit: MAX_FRAME_LEN,
                    });
                }
                if r.take(len).is_none() {
                    return Ok(None);
                }
            }
            let mut r = Reader { buf, at: 0 };
            let mut values = Vec::with_capacity(n);
            for _ in 0..n {
                // Cannot fail: the walk above found every value whole.
                match r.value()? {
                    Some(v) => values.push(v),
                    None => return Ok(None),
                }
            }
            Some(Answer::Values(values))
        }
    };
    Ok(answer.map(|a| (a, r.at)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(q: Query<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        q.encode(&mut out);
        assert_eq!(out.len(), q.encoded_len(), "{q:?}");
        out
    }

    /// A u64 length in little-endian.
    fn len(n: u64) -> Vec<u8> {
        n.to_le_bytes().to_vec()
    }

    fn cat(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn validate_and_ping_open_a_connection() {
        assert_eq!(bytes(Query::Validate), [0, 0xCE, 0xF7, 0x85, 0x3C]);
        assert_eq!(bytes(Query::Ping(0x0102_0304)), [13, 4, 3, 2, 1]);
        assert_eq!(Query::Validate.expect(), Expect::Nothing);
        assert_eq!(
            decode(Expect::U32, &[4, 3, 2, 1]).unwrap(),
            Some((Answer::U32(0x0102_0304), 4))
        );
    }

    #[test]
    fn key_value_queries_are_a_query_byte_and_length_prefixed_fields() {
        assert_eq!(
            bytes(Query::Set("ab", b"xyz")),
            cat(&[&[1], &len(2), b"ab", &len(3), b"xyz"])
        );
        assert_eq!(
            bytes(Query::CompareSet("k", b"", b"v")),
            cat(&[&[2], &len(1), b"k", &len(0), &len(1), b"v"])
        );
        assert_eq!(bytes(Query::Get("k")), cat(&[&[3], &len(1), b"k"]));
        assert_eq!(
            bytes(Query::Add("n", -2)),
            cat(&[&[4], &len(1), b"n", &(-2i64).to_le_bytes()])
        );
        assert_eq!(bytes(Query::Delete("k")), cat(&[&[8], &len(1), b"k"]));
        assert_eq!(bytes(Query::NumKeys), [7]);
        assert_eq!(bytes(Query::CancelWait), [12]);
    }

    #[test]
    fn key_lists_are_a_count_and_strings() {
        let keys = ["a", "bc"];
        let list = cat(&[&len(2), &len(1), b"a", &len(2), b"bc"]);
        assert_eq!(bytes(Query::Check(&keys)), cat(&[&[5], &list]));
        assert_eq!(bytes(Query::Wait(&keys)), cat(&[&[6], &list]));
        assert_eq!(bytes(Query::MultiGet(&keys)), cat(&[&[10], &list]));
        let entries: [(&str, &[u8]); 2] = [("a", b"1"), ("b", b"")];
        assert_eq!(
            bytes(Query::MultiSet(&entries)),
            cat(&[
                &[11],
                &len(2),
                &len(1),
                b"a",
                &len(1),
                b"1",
                &len(1),
                b"b",
                &len(0)
            ])
        );
    }

    #[test]
    fn each_query_expects_its_reply() {
        assert_eq!(Query::Set("k", b"v").expect(), Expect::Nothing);
        assert_eq!(Query::MultiSet(&[]).expect(), Expect::Nothing);
        assert_eq!(Query::Get("k").expect(), Expect::Bytes);
        assert_eq!(Query::CompareSet("k", b"", b"").expect(), Expect::Bytes);
        assert_eq!(Query::Add("k", 1).expect(), Expect::I64);
        assert_eq!(Query::NumKeys.expect(), Expect::I64);
        assert_eq!(Query::Delete("k").expect(), Expect::I64);
        assert_eq!(Query::Check(&["k"]).expect(), Expect::Byte);
        assert_eq!(Query::Wait(&["k"]).expect(), Expect::Byte);
        assert_eq!(Query::CancelWait.expect(), Expect::Byte);
        assert_eq!(Query::MultiGet(&["a", "b"]).expect(), Expect::Values(2));
    }

    #[test]
    fn replies_decode_only_once_whole() {
        let reply = cat(&[&len(3), b"abc", b"next"]);
        for cut in 0..7 {
            assert_eq!(decode(Expect::Bytes, &reply[..cut]).unwrap(), None, "{cut}");
        }
        assert_eq!(
            decode(Expect::Bytes, &reply).unwrap(),
            Some((Answer::Bytes(b"abc".to_vec()), 11))
        );
        assert_eq!(
            decode(Expect::I64, &7i64.to_le_bytes()).unwrap(),
            Some((Answer::I64(7), 8))
        );
        assert_eq!(decode(Expect::I64, &[1, 2, 3]).unwrap(), None);
        assert_eq!(
            decode(Expect::Byte, &[1, 9]).unwrap(),
            Some((Answer::Byte(1), 1))
        );
        let values = cat(&[&len(1), b"x", &len(0), &len(2), b"yz"]);
        for cut in 0..values.len() {
            assert_eq!(decode(Expect::Values(3), &values[..cut]).unwrap(), None);
        }
        assert_eq!(
            decode(Expect::Values(3), &values).unwrap(),
            Some((
                Answer::Values(vec![b"x".to_vec(), vec![], b"yz".to_vec()]),
                values.len()
            ))
        );
        assert_eq!(
            decode(Expect::Values(0), &[]).unwrap(),
            Some((Answer::Values(vec![]), 0))
        );
    }

    #[test]
    fn oversized_lengths_are_refused_before_allocating() {
        let huge = len(u64::MAX);
        assert!(matches!(
            decode(Expect::Bytes, &huge),
            Err(StoreError::TooLarge { limit, .. }) if limit == MAX_VALUE_LEN
        ));
        let over = len(MAX_VALUE_LEN as u64 + 1);
        assert!(matches!(
            decode(Expect::Values(1), &over),
            Err(StoreError::TooLarge { .. })
        ));
        // Each value within its limit, the reply over the frame limit: the
        // second length is enough to refuse it, before its bytes arrive.
        let mut first = len(MAX_VALUE_LEN as u64);
        first.resize(8 + MAX_VALUE_LEN, 0);
        let mut fits = first.clone();
        fits.extend_from_slice(&len(MAX_VALUE_LEN as u64 - 32));
        assert_eq!(decode(Expect::Values(2), &fits).unwrap(), None);
        let mut over = first;
        over.extend_from_slice(&len(MAX_VALUE_LEN as u64));
        assert!(matches!(
            decode(Expect::Values(2), &over),
            Err(StoreError::TooLarge { limit, .. }) if limit == MAX_FRAME_LEN
        ));
    }

    #[test]
    fn requests_over_the_limits_are_refused() {
        let long = "k".repeat(crate::wire::MAX_KEY_LEN + 1);
        assert!(matches!(
            Query::Get(&long).check(),
            Err(StoreError::TooLarge { what: "key", .. })
        ));
        let big = vec![0u8; MAX_VALUE_LEN + 1];
        assert!(matches!(
            Query::Set("k", &big).check(),
            Err(StoreError::TooLarge { what: "value", .. })
        ));
        let fine = vec![0u8; MAX_VALUE_LEN];
        let entries: [(&str, &[u8]); 2] = [("a", &fine), ("b", &fine)];
        assert!(matches!(
            Query::MultiSet(&entries).check(),
            Err(StoreError::TooLarge {
                what: "request",
                ..
            })
        ));
        let many = vec!["k"; crate::wire::MAX_KEYS_PER_OP + 1];
        assert!(matches!(
            Query::Wait(&many).check(),
            Err(StoreError::TooLarge {
                what: "key list",
                ..
            })
        ));
        Query::Set("k", &fine).check().unwrap();
    }

    #[test]
    fn check_replies_are_ready_or_not() {
        assert!(check_ready(0).unwrap());
        assert!(!check_ready(1).unwrap());
        assert!(matches!(check_ready(2), Err(StoreError::Protocol(_))));
    }
}
