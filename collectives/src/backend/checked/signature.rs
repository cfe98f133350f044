//! What every rank must agree on of a device op ([`Signature`]), how one
//! reads in a mismatch, and the digest the ranks compare first.

use chorus_core::flight_recorder::OpMeta;
use chorus_core::{DType, Op, ReduceOp};

/// What every rank must agree on of one device op: op code, dtype code,
/// count, root or peer (`u64::MAX`: none), reduction code (`u64::MAX`:
/// none).
pub(crate) type Signature = [u64; 5];

pub(super) const NONE: u64 = u64::MAX;

/// Op codes of the signatures.
const NAMES: [&str; 10] = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "send",
    "recv",
    "send_recv",
    "barrier",
];

/// The signature of `op` on `count` elements of `dtype`.
pub(crate) fn signature(op: Op, dtype: Option<DType>, count: usize) -> Signature {
    let code = NAMES
        .iter()
        .position(|n| *n == op.name())
        .map_or(NONE, |i| i as u64);
    let redop = op.reduction().map_or(NONE, |r| r as u64);
    [
        code,
        dtype.map_or(NONE, |d| d as u64),
        count as u64,
        op.peer().map_or(NONE, |p| p as u64),
        redop,
    ]
}

/// The signature of `op` as its flight record `meta` describes it.
pub(crate) fn signature_of(op: Op, meta: &OpMeta) -> Signature {
    let dtype = meta
        .dtype
        .as_deref()
        .and_then(|n| DType::ALL.iter().copied().find(|d| d.name() == n));
    signature(op, dtype, meta.count as usize)
}

/// One side of a mismatch: `all_reduce(count=8, dtype=f32, op=sum)`, with
/// the fields both have.
pub(super) fn describe(s: &Signature) -> String {
    let name = NAMES.get(s[0] as usize).copied().unwrap_or("unknown-op");
    let mut d = format!("{name}(count={}", s[2]);
    if let Some(t) = DType::from_u8(s[1] as u8).filter(|_| s[1] != NONE) {
        d.push_str(&format!(", dtype={t}"));
    }
    if s[3] != NONE {
        d.push_str(&format!(", root={}", s[3]));
    }
    if let Some(r) = ReduceOp::from_u8(s[4] as u8).filter(|_| s[4] != NONE) {
        d.push_str(&format!(", op={}", r.name()));
    }
    d.push(')');
    d
}

/// FNV-1a over the signatures.
pub(super) fn digest(sigs: &[Signature]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in sigs.iter().flatten() {
        for b in v.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}
