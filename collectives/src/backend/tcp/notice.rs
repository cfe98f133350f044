//! The fault notice: the last frame a rank whose group failed sends each
//! peer before it closes the connection, saying why, so that the peers fail
//! with the cause (a mismatch, a lost or silent rank, a timeout) rather than
//! with the close that follows.
//!
//! A [`CLASS_FAULT`](super::wire::CLASS_FAULT) frame's header carries the
//! seq of the op that failed (0 when the group failed between ops); its
//! payload is:
//!
//! | bytes   | field | meaning                                           |
//! |---------|-------|---------------------------------------------------|
//! | 0       | kind  | [`Kind`]                                          |
//! | 1..4    | -     | zero                                              |
//! | 4..8    | peer  | the rank lost, silent or gone (`PeerLost`,        |
//! |         |       | `PeerSilent`, `PeerLeft`), or where a relayed     |
//! |         |       | failure began (`Remote`)                          |
//! | 8..16   | after | the liveness timeout in ms (`PeerSilent`)         |
//! | 16..20  | len   | bytes of text that follow                         |
//! | 20..    | text  | UTF-8: the mismatch's detail, else the error      |

use std::time::Duration;

use chorus_core::{OpContext, WorkError};

/// Longest text a notice carries (longer texts are cut).
pub(super) const MAX_TEXT: usize = 4096;
/// Fixed part of an encoded notice.
const FIXED: usize = 20;
/// Longest encoded notice.
pub(super) const MAX_NOTICE: usize = FIXED + MAX_TEXT;

/// What kind of failure a notice reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    /// Anything else: the peer's error, as text.
    Other = 0,
    /// Ranks called different ops: the detail names both sides.
    Mismatch = 1,
    /// The peer lost its connection to another rank.
    PeerLost = 2,
    /// Another rank went silent.
    PeerSilent = 3,
    /// Another rank left the group cleanly, before an op needed it.
    PeerLeft = 4,
    /// Another rank failed and reported it to the sender: passed on with
    /// that rank as the origin, so a failure relayed from rank to rank
    /// still names where it began.
    Remote = 5,
}

/// Why a peer's group failed, as it told this rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Notice {
    kind: Kind,
    /// The rank lost or silent, for those kinds.
    peer: u32,
    after_ms: u64,
    text: String,
}

impl Notice {
    /// The notice a rank sends when its group failed with `e`.
    pub(super) fn of(e: &WorkError) -> Notice {
        let (kind, peer, after_ms, text) = match e {
            WorkError::Mismatch { detail, .. } => (Kind::Mismatch, 0, 0, detail.clone()),
            WorkError::PeerLost { peer, cause, .. } => {
                (Kind::PeerLost, *peer as u32, 0, cause.clone())
            }
            WorkError::PeerSilent { peer, after, .. } => (
                Kind::PeerSilent,
                *peer as u32,
                after.as_millis() as u64,
                String::new(),
            ),
            WorkError::PeerLeft { peer, .. } => (Kind::PeerLeft, *peer as u32, 0, String::new()),
            WorkError::Remote { origin, cause, .. } => {
                (Kind::Remote, *origin as u32, 0, cause.clone())
            }
            other => (Kind::Other, 0, 0, other.to_string()),
        };
        let mut text = text;
        if text.len() > MAX_TEXT {
            let mut cut = MAX_TEXT;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        Notice {
            kind,
            peer,
            after_ms,
            text,
        }
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FIXED + self.text.len());
        b.extend_from_slice(&[self.kind as u8, 0, 0, 0]);
        b.extend_from_slice(&self.peer.to_le_bytes());
        b.extend_from_slice(&self.after_ms.to_le_bytes());
        b.extend_from_slice(&(self.text.len() as u32).to_le_bytes());
        b.extend_from_slice(self.text.as_bytes());
        b
    }

    /// Decodes a notice.
    ///
    /// # Errors
    ///
    /// A description of what is malformed (a corrupt stream).
    pub(super) fn decode(b: &[u8]) -> Result<Notice, String> {
        let bad = |what: &str| format!("malformed fault notice from the peer: {what}");
        if b.len() < FIXED {
            return Err(bad("too short"));
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let kind = match b[0] {
            0 => Kind::Other,
            1 => Kind::Mismatch,
            2 => Kind::PeerLost,
            3 => Kind::PeerSilent,
            4 => Kind::PeerLeft,
            5 => Kind::Remote,
            k => return Err(bad(&format!("unknown kind {k}"))),
        };
        let mut after = [0u8; 8];
        after.copy_from_slice(&b[8..16]);
        let len = u32_at(16) as usize;
        if len > MAX_TEXT || b.len() != FIXED + len {
            return Err(bad("bad text length"));
        }
        let text = String::from_utf8(b[FIXED..].to_vec()).map_err(|_| bad("text not UTF-8"))?;
        Ok(Notice {
            kind,
            peer: u32_at(4),
            after_ms: u64::from_le_bytes(after),
            text,
        })
    }

    /// The failure of this rank (`ctx`: its failure outside any op) that
    /// the notice of `from` means: a mismatch stays a mismatch, a rank
    /// lost, silent or gone stays one naming that rank, a failure relayed
    /// names the rank where it began, anything else is
    /// [`WorkError::Remote`] from `from`.
    pub(super) fn error(&self, ctx: OpContext, from: usize) -> WorkError {
        let peer = self.peer as usize;
        match self.kind {
            Kind::Mismatch => WorkError::Mismatch {
                ctx,
                detail: format!(
                    "{} (found by rank {from}, which stopped its group)",
                    self.text
                ),
            },
            Kind::PeerLost if peer != ctx.rank => WorkError::PeerLost {
                ctx,
                peer,
                cause: format!("rank {from} lost its connection to it ({})", self.text),
            },
            Kind::PeerSilent if peer != ctx.rank => WorkError::PeerSilent {
                ctx,
                peer,
                after: Duration::from_millis(self.after_ms),
            },
            Kind::PeerLeft if peer != ctx.rank => WorkError::PeerLeft { ctx, peer },
            Kind::Remote => WorkError::Remote {
                ctx,
                origin: peer,
                cause: self.text.clone(),
            },
            _ => WorkError::Remote {
                ctx,
                origin: from,
                cause: if self.text.is_empty() {
                    format!("its connection to rank {peer} (this rank) failed")
                } else {
                    self.text.clone()
                },
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(rank: usize) -> OpContext {
        OpContext::new(rank, "g".into(), 7, "all_reduce")
    }

    #[test]
    fn notices_roundtrip_and_keep_their_kind() {
        let cases = [
            WorkError::Mismatch {
                ctx: ctx(0),
                detail: "rank 1 at seq 7 called broadcast(count=4, root=1) but rank 0 called broadcast(count=4, root=0)".into(),
            },
            WorkError::PeerLost {
                ctx: ctx(0),
                peer: 3,
                cause: "read failed".into(),
            },
            WorkError::PeerSilent {
                ctx: ctx(0),
                peer: 2,
                after: Duration::from_secs(10),
            },
            WorkError::PeerLeft {
                ctx: ctx(0),
                peer: 2,
            },
            WorkError::OpTimeout {
                ctx: ctx(0),
                after: Duration::from_secs(1),
            },
        ];
        for e in cases {
            let n = Notice::of(&e);
            assert_eq!(Notice::decode(&n.encode()), Ok(n.clone()));
            let seen = n.error(ctx(1), 0);
            assert_eq!(seen.context().rank, 1);
            match (&e, &seen) {
                (WorkError::Mismatch { detail: a, .. }, WorkError::Mismatch { detail: b, .. }) => {
                    assert!(
                        b.starts_with(a.as_str()) && b.contains("found by rank 0"),
                        "{b}"
                    )
                }
                (WorkError::PeerLost { peer: a, .. }, WorkError::PeerLost { peer: b, .. }) => {
                    assert_eq!(a, b)
                }
                (
                    WorkError::PeerSilent {
                        peer: a, after: x, ..
                    },
                    WorkError::PeerSilent {
                        peer: b, after: y, ..
                    },
                ) => assert_eq!((a, x), (b, y)),
                (WorkError::PeerLeft { peer: a, .. }, WorkError::PeerLeft { peer: b, .. }) => {
                    assert_eq!(a, b)
                }
                (WorkError::OpTimeout { .. }, WorkError::Remote { origin, cause, .. }) => {
                    assert_eq!(*origin, 0);
                    assert!(cause.contains("timed out"), "{cause}");
                }
                _ => panic!("{e} became {seen}"),
            }
        }
    }

    #[test]
    fn a_relayed_failure_names_where_it_began() {
        let n = Notice::of(&WorkError::Remote {
            ctx: ctx(1),
            origin: 3,
            cause: "rank 3 timed out".into(),
        });
        assert!(matches!(
            n.error(ctx(2), 1),
            WorkError::Remote { origin: 3, ref cause, .. } if cause == "rank 3 timed out"
        ));
    }

    #[test]
    fn a_lost_peer_that_is_the_receiver_is_the_senders_failure() {
        let n = Notice::of(&WorkError::PeerLost {
            ctx: ctx(0),
            peer: 1,
            cause: "reset".into(),
        });
        assert!(matches!(
            n.error(ctx(1), 0),
            WorkError::Remote { origin: 0, .. }
        ));
    }

    #[test]
    fn long_texts_are_cut_and_bad_notices_refused() {
        let e = WorkError::Backend {
            ctx: ctx(0),
            msg: "é".repeat(MAX_TEXT),
        };
        let b = Notice::of(&e).encode();
        assert!(b.len() <= MAX_NOTICE);
        assert!(Notice::decode(&b).is_ok());
        assert!(Notice::decode(&b[..10]).is_err());
        let mut bad = b.clone();
        bad[0] = 9;
        assert!(Notice::decode(&bad).is_err());
        let mut bad = b;
        bad[16] ^= 1;
        assert!(Notice::decode(&bad).is_err());
    }
}
