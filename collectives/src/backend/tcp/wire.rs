//! Wire format of the TCP backend: the connection handshake and the header
//! every frame carries.
//!
//! All integers are little-endian. A frame is a [`HEADER_LEN`]-byte header
//! followed by `len` payload bytes:
//!
//! | bytes  | field  | meaning                                             |
//! |--------|--------|-----------------------------------------------------|
//! | 0..4   | magic  | [`MAGIC`]                                           |
//! | 4..8   | group  | FNV-1a hash of the group name                       |
//! | 8..16  | seq    | collective seq, or p2p message number of the pair   |
//! | 16..24 | count  | the op's element count (see [`Sig`])                |
//! | 24..32 | len    | payload bytes of this frame                         |
//! | 32..36 | frame  | index of this frame among the op's frames to a peer |
//! | 36..40 | root   | root rank, or [`NONE32`]                            |
//! | 40     | class  | [`CLASS_COLL`], [`CLASS_P2P`], [`CLASS_BYE`] or     |
//! |        |        | [`CLASS_FAULT`]                                     |
//! | 41     | op     | op code ([`op_code`])                               |
//! | 42     | dtype  | dtype byte, or [`NONE8`]                            |
//! | 43     | redop  | reduce-op byte, or [`NONE8`]                        |
//! | 44     | algo   | [`ALGO_DIRECT`], [`ALGO_RING`], [`ALGO_CHAIN`],     |
//! |        |        | [`ALGO_RS_BCAST`], [`ALGO_CHECK`],                  |
//! |        |        | [`ALGO_DOUBLING`], [`ALGO_TREE`] or                 |
//! |        |        | [`ALGO_DISSEMINATION`]                              |
//! | 45     | -      | zero                                                |
//! | 46..48 | shm    | 0: the payload follows; `k + 1`: the payload is in  |
//! |        |        | shared-memory slot `k` and nothing follows (`shm`); |
//! |        |        | bit 15 set: of the sender's broadcast segment       |
//!
//! The seq of an op chorus issues for itself (`admit`'s exchange) is its
//! number among such ops with [`OWN_SEQ`] set, so that it never equals a
//! program op's. A [`CLASS_FAULT`] frame carries a [`Notice`] as payload.

use chorus_core::{DType, ReduceOp};

use super::shm_board::SIG_LEN;

/// First bytes of every frame and handshake ("CHRC").
pub(super) const MAGIC: u32 = 0x4348_5243;
/// Protocol version, checked in the handshake.
pub(super) const VERSION: u16 = 2;
/// Size of a frame header.
pub(super) const HEADER_LEN: usize = 48;
/// Longest group name accepted in a handshake.
pub(super) const MAX_NAME: usize = 4096;

/// A u32 field that is not set.
pub(super) const NONE32: u32 = u32::MAX;
/// A u8 field that is not set.
pub(super) const NONE8: u8 = u8::MAX;

/// Frames of collectives.
pub(super) const CLASS_COLL: u8 = 0;
/// Frames of send/recv.
pub(super) const CLASS_P2P: u8 = 1;
/// The last frame on a connection whose backend shut down cleanly.
pub(super) const CLASS_BYE: u8 = 2;
/// The last frame on a connection whose backend failed: why ([`Notice`]).
pub(super) const CLASS_FAULT: u8 = 3;

/// Bit of a frame's seq that marks an op chorus issued for itself.
pub(super) const OWN_SEQ: u64 = 1 << 63;

/// Every rank sends to every other rank directly.
pub(super) const ALGO_DIRECT: u8 = 0;
/// Ring (reduce-scatter and/or all-gather).
pub(super) const ALGO_RING: u8 = 1;
/// Pipelined chain (broadcast).
pub(super) const ALGO_CHAIN: u8 = 2;
/// Ring reduce-scatter, then every rank's block from its owner through
/// shared memory (all_reduce with every rank on one host).
pub(super) const ALGO_RS_BCAST: u8 = 3;
/// The signature round of the checked mode: an empty frame to and from
/// every rank before the op's own frames.
pub(super) const ALGO_CHECK: u8 = 4;
/// Recursive doubling (the small all_reduce).
pub(super) const ALGO_DOUBLING: u8 = 5;
/// A binomial tree (the small broadcast, the reduce).
pub(super) const ALGO_TREE: u8 = 6;
/// The dissemination barrier.
pub(super) const ALGO_DISSEMINATION: u8 = 7;
/// The group's shared-memory board (no frames: the signature sits in each
/// rank's area of the board, see `board`).
pub(super) const ALGO_BOARD: u8 = 8;

/// Op names by wire code: the program's ops, then chorus's own.
const OPS: [&str; 11] = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "send",
    "recv",
    "barrier",
    "admit",
    "check",
];

/// The seq a frame of the op at `ctx` carries: its sequence number, or for
/// one of chorus's own ops its number among those with [`OWN_SEQ`] set.
pub(super) fn wire_seq(ctx: &chorus_core::OpContext) -> u64 {
    ctx.internal.map_or(ctx.seq, |k| OWN_SEQ | k.get())
}

/// Where a wire seq sits, for messages: `at seq 7`, or `at chorus's own op
/// #2` for one of chorus's own ops.
pub(super) fn at_seq(seq: u64) -> String {
    if seq & OWN_SEQ != 0 {
        format!("at chorus's own op #{}", seq & !OWN_SEQ)
    } else {
        format!("at seq {seq}")
    }
}

/// The detail of a mismatch between the op `theirs` that `peer` called and
/// the op `ours` (named `our_name`) of this rank `me`, e.g. `rank 1 at seq
/// 7 called all_gather(count=10) but rank 0 called all_reduce(count=12)`.
pub(super) fn mismatch_detail(
    peer: usize,
    theirs: &Sig,
    me: usize,
    ours: &Sig,
    our_name: &str,
) -> String {
    let t = theirs.describe(op_name(theirs.op), ours);
    let o = ours.describe(our_name, theirs);
    let mut d = if theirs.seq == ours.seq {
        format!(
            "rank {peer} {} called {t} but rank {me} called {o}",
            at_seq(theirs.seq)
        )
    } else {
        format!(
            "rank {peer} {} called {t} but rank {me} {} called {o}",
            at_seq(theirs.seq),
            at_seq(ours.seq)
        )
    };
    if op_name(theirs.op) == "admit" || our_name == "admit" {
        d.push_str(
            ": every member must call admit at the same point of its program, and a rank \
             that rejoined calls it before any op of its new group (docs/FAULTS.md, Growing back)",
        );
    }
    d
}

/// The wire code of an op name (as given by `OpKind::name`).
pub(super) fn op_code(name: &str) -> u8 {
    OPS.iter()
        .position(|o| *o == name)
        .map_or(NONE8, |i| i as u8)
}

/// The op name of a wire code.
pub(super) fn op_name(code: u8) -> &'static str {
    OPS.get(code as usize).copied().unwrap_or("unknown-op")
}

/// FNV-1a hash of a group name.
pub(super) fn group_hash(name: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// What every rank taking part in one op must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Sig {
    pub(super) seq: u64,
    pub(super) op: u8,
    pub(super) dtype: u8,
    pub(super) redop: u8,
    pub(super) root: u32,
    /// all_reduce, broadcast, reduce, send/recv: the buffer's length;
    /// all_gather: the input's length; reduce_scatter: the output's length;
    /// all_to_all: the input's length; barrier: 0.
    pub(super) count: u64,
    pub(super) algo: u8,
}

impl Sig {
    /// The signature as a board area holds it (see `shm_board`).
    pub(super) fn to_board(self) -> [u8; SIG_LEN] {
        let mut b = [0u8; SIG_LEN];
        b[0..8].copy_from_slice(&self.seq.to_le_bytes());
        b[8..16].copy_from_slice(&self.count.to_le_bytes());
        b[16..20].copy_from_slice(&self.root.to_le_bytes());
        b[20] = self.op;
        b[21] = self.dtype;
        b[22] = self.redop;
        b[23] = self.algo;
        b
    }

    /// A signature read from a board area.
    pub(super) fn from_board(b: &[u8; SIG_LEN]) -> Sig {
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        Sig {
            seq: u64_at(0),
            count: u64_at(8),
            root: u32::from_le_bytes(b[16..20].try_into().unwrap_or([0; 4])),
            op: b[20],
            dtype: b[21],
            redop: b[22],
            algo: b[23],
        }
    }

    /// Human description of one side of a mismatch: the op and count, plus
    /// the fields that differ from `other`; one of chorus's own ops by its
    /// name and where it comes from.
    pub(super) fn describe(&self, name: &str, other: &Sig) -> String {
        if self.seq & OWN_SEQ != 0 {
            return match name {
                "check" => "check (the checked mode's exchange before a device op)".into(),
                name => format!("{name} (chorus's own exchange in ProcessGroup::{name})"),
            };
        }
        let mut s = format!("{name}(count={}", self.count);
        // Only fields both sides have and disagree on.
        if self.dtype != other.dtype && self.dtype != NONE8 && other.dtype != NONE8 {
            s.push_str(&format!(", dtype={}", dtype_name(self.dtype)));
        }
        if self.redop != other.redop && self.redop != NONE8 && other.redop != NONE8 {
            let r = ReduceOp::from_u8(self.redop).map_or("unknown", |r| r.name());
            s.push_str(&format!(", op={r}"));
        }
        if self.root != other.root && self.root != NONE32 && other.root != NONE32 {
            s.push_str(&format!(", root={}", self.root));
        }
        s.push(')');
        s
    }
}

fn dtype_name(b: u8) -> &'static str {
    if b == NONE8 {
        "none"
    } else {
        DType::from_u8(b).map_or("unknown", |d| d.name())
    }
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Header {
    pub(super) group: u32,
    pub(super) class: u8,
    pub(super) sig: Sig,
    pub(super) frame: u32,
    pub(super) len: u64,
    /// 0, or 1 + the shared-memory slot holding the payload.
    pub(super) shm: u16,
}

impl Header {
    pub(super) fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.group.to_le_bytes());
        b[8..16].copy_from_slice(&self.sig.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.sig.count.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b[32..36].copy_from_slice(&self.frame.to_le_bytes());
        b[36..40].copy_from_slice(&self.sig.root.to_le_bytes());
        b[40] = self.class;
        b[41] = self.sig.op;
        b[42] = self.sig.dtype;
        b[43] = self.sig.redop;
        b[44] = self.sig.algo;
        b[46..48].copy_from_slice(&self.shm.to_le_bytes());
        b
    }

    /// Decodes a header.
    ///
    /// # Errors
    ///
    /// A description if the magic or class is wrong (a corrupt stream).
    pub(super) fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, String> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(format!(
                "bad frame magic {magic:#010x} (expected {MAGIC:#010x}): the stream is corrupt or the peer is not a chorus TCP backend"
            ));
        }
        let class = b[40];
        if class > CLASS_FAULT {
            return Err(format!("unknown frame class {class}"));
        }
        Ok(Header {
            group: u32_at(4),
            class,
            sig: Sig {
                seq: u64_at(8),
                count: u64_at(16),
                root: u32_at(36),
                op: b[41],
                dtype: b[42],
                redop: b[43],
                algo: b[44],
            },
            frame: u32_at(32),
            len: u64_at(24),
            shm: u16::from_le_bytes([b[46], b[47]]),
        })
    }
}

/// The first message on a new connection, sent by both sides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Hello {
    pub(super) group: String,
    pub(super) from: u32,
    pub(super) to: u32,
    pub(super) size: u32,
    pub(super) crossover: u64,
    pub(super) chunk: u64,
    /// Bit [`HELLO_SHM`]: this rank offers shared memory to local peers.
    pub(super) flags: u16,
}

/// [`Hello::flags`] bit: shared memory wanted (see `shm`).
pub(super) const HELLO_SHM: u16 = 1;
/// [`Hello::flags`] bit: the sender published a broadcast segment (` shm`
/// in its address).
pub(super) const HELLO_BCAST: u16 = 2;
/// [`Hello::flags`] bit: the (connecting) sender read the receiver's
/// published host and it is the sender's own.
pub(super) const HELLO_SAME_HOST: u16 = 4;
/// [`Hello::flags`] bit: the sender runs the checked mode (every op's
/// signature verified against every rank's; both ends must agree).
pub(super) const HELLO_CHECKED: u16 = 8;
/// [`Hello::flags`] bit, in an acceptor's answer only: the acceptor (the
/// lower rank of the pair) is dialling the sender itself, and that
/// connection is the pair's; the sender closes this one and waits for it.
pub(super) const HELLO_DUP: u16 = 16;

/// Fixed part of an encoded [`Hello`] (the group name follows).
pub(super) const HELLO_FIXED: usize = 40;

impl Hello {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HELLO_FIXED + self.group.len());
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&self.flags.to_le_bytes());
        b.extend_from_slice(&self.from.to_le_bytes());
        b.extend_from_slice(&self.to.to_le_bytes());
        b.extend_from_slice(&self.size.to_le_bytes());
        b.extend_from_slice(&self.crossover.to_le_bytes());
        b.extend_from_slice(&self.chunk.to_le_bytes());
        b.extend_from_slice(&(self.group.len() as u32).to_le_bytes());
        b.extend_from_slice(self.group.as_bytes());
        b
    }

    /// Decodes the fixed part; returns the hello without its name and the
    /// name's length.
    ///
    /// # Errors
    ///
    /// A description if magic, version or name length are wrong.
    pub(super) fn decode_fixed(b: &[u8; HELLO_FIXED]) -> Result<(Hello, usize), String> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let magic = u32_at(0);
        if magic != MAGIC {
            return Err(format!(
                "bad handshake magic {magic:#010x}: the peer is not a chorus TCP backend"
            ));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(format!(
                "peer speaks protocol version {version}, this rank speaks {VERSION}: run the same chorus version on every rank"
            ));
        }
        let name_len = u32_at(36) as usize;
        if name_len > MAX_NAME {
            return Err(format!(
                "group name of {name_len} bytes in handshake, over the limit of {MAX_NAME}"
            ));
        }
        Ok((
            Hello {
                group: String::new(),
                from: u32_at(8),
                to: u32_at(12),
                size: u32_at(16),
                crossover: u64_at(20),
                chunk: u64_at(28),
                flags: u16::from_le_bytes([b[6], b[7]]),
            },
            name_len,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip() {
        let h = Header {
            group: group_hash("world"),
            class: CLASS_P2P,
            sig: Sig {
                seq: 0x0102_0304_0506_0708,
                op: op_code("send"),
                dtype: DType::BF16 as u8,
                redop: NONE8,
                root: 3,
                count: 99,
                algo: ALGO_RING,
            },
            frame: 7,
            len: 12345,
            shm: 3,
        };
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert!(Header::decode(&bad).is_err());
    }

    #[test]
    fn hello_roundtrip() {
        let h = Hello {
            group: "g".into(),
            from: 1,
            to: 2,
            size: 3,
            crossover: 4,
            chunk: 5,
            flags: HELLO_SHM,
        };
        let b = h.encode();
        let mut fixed = [0u8; HELLO_FIXED];
        fixed.copy_from_slice(&b[..HELLO_FIXED]);
        let (mut d, n) = Hello::decode_fixed(&fixed).unwrap();
        d.group = String::from_utf8(b[HELLO_FIXED..HELLO_FIXED + n].to_vec()).unwrap();
        assert_eq!(d, h);
    }

    #[test]
    fn op_codes() {
        for name in OPS {
            assert_eq!(op_name(op_code(name)), name);
        }
        assert_eq!(op_code("nope"), NONE8);
    }
}
