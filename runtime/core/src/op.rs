//! The op vocabulary every layer shares: element types ([`DType`]),
//! reductions ([`ReduceOp`]) and what an op does ([`Op`]), with the shape
//! rules its buffers must follow ([`Op::check`]).
//!
//! The TCP backend encodes these in its frame headers, the GPU layer maps
//! them to NCCL's enums, and the flight recorder names them: one set of
//! names for all.

use std::fmt;

/// The element types chorus supports.
///
/// The discriminant is the type's byte on the TCP backend's wire and must
/// not change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DType {
    /// 32-bit float.
    F32 = 0,
    /// 64-bit float.
    F64 = 1,
    /// IEEE half precision.
    F16 = 2,
    /// bfloat16.
    BF16 = 3,
    /// Signed 8-bit integer.
    I8 = 4,
    /// Unsigned 8-bit integer.
    U8 = 5,
    /// Signed 32-bit integer.
    I32 = 6,
    /// Signed 64-bit integer.
    I64 = 7,
    /// Unsigned 32-bit integer.
    U32 = 8,
    /// Unsigned 64-bit integer.
    U64 = 9,
}

impl DType {
    /// All supported types, in wire-byte order.
    pub const ALL: [DType; 10] = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I32,
        DType::I64,
        DType::U32,
        DType::U64,
    ];

    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// Lower-case name, as in `f32`.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U32 => "u32",
            DType::U64 => "u64",
        }
    }

    /// True for the floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// Decodes the wire byte of a dtype.
    pub fn from_u8(v: u8) -> Option<DType> {
        DType::ALL.get(v as usize).copied()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a reduction combines elements.
///
/// The discriminant is the reduction's byte on the TCP backend's wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ReduceOp {
    /// Sum.
    Sum = 0,
    /// Product.
    Prod = 1,
    /// Minimum.
    Min = 2,
    /// Maximum.
    Max = 3,
    /// Mean: the sum divided by the group size (integer types divide with
    /// truncation toward zero, as NCCL's `ncclAvg` does).
    Avg = 4,
}

impl ReduceOp {
    /// Every reduction, in wire-byte order.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// Lower-case name.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// Decodes the wire byte of a reduce op.
    pub fn from_u8(v: u8) -> Option<ReduceOp> {
        ReduceOp::ALL.get(v as usize).copied()
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What an op does, apart from its buffers.
///
/// Ranks are the ranks of whatever runs the op: the group's for a
/// collective, and for the GPU layer the communicator's (a point-to-point
/// communicator has ranks 0 and 1). Buffers, in order, are those
/// [`buffers`](Self::buffers) counts: in-place ops take one, the others an
/// input and an output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// In place: every rank ends with the reduction of all ranks' buffer.
    AllReduce(ReduceOp),
    /// In place: every rank ends with `root`'s buffer.
    Broadcast {
        /// The root rank.
        root: usize,
    },
    /// In place: `root` ends with the reduction; the other ranks' buffers
    /// come back unchanged (TCP) or unspecified (NCCL).
    Reduce {
        /// The root rank.
        root: usize,
        /// The reduction.
        op: ReduceOp,
    },
    /// Input (count c) into output (count nranks × c), in rank order.
    AllGather,
    /// Input (count nranks × c) reduced across ranks; rank r gets block r
    /// in the output (count c).
    ReduceScatter(ReduceOp),
    /// Input and output of nranks × k elements: block j of rank i's input
    /// goes to block i of rank j's output.
    AllToAll,
    /// Sends the buffer to `peer`.
    Send {
        /// The receiving rank.
        peer: usize,
    },
    /// Receives into the buffer from `peer`.
    Recv {
        /// The sending rank.
        peer: usize,
    },
    /// Sends the input to and receives the output from `peer`, as one op
    /// (the peer may be this rank).
    SendRecv {
        /// The other rank.
        peer: usize,
    },
    /// Completes once every rank has entered it; no buffers.
    Barrier,
}

impl Op {
    /// The op's name, as errors, traces and the TCP backend's wire name it
    /// (`"all_reduce"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Op::AllReduce(_) => "all_reduce",
            Op::Broadcast { .. } => "broadcast",
            Op::Reduce { .. } => "reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter(_) => "reduce_scatter",
            Op::AllToAll => "all_to_all",
            Op::Send { .. } => "send",
            Op::Recv { .. } => "recv",
            Op::SendRecv { .. } => "send_recv",
            Op::Barrier => "barrier",
        }
    }

    /// The name of the op applied to several buffers as one
    /// (`"all_reduce_coalesced"`, ...).
    pub const fn coalesced_name(self) -> &'static str {
        match self {
            Op::AllReduce(_) => "all_reduce_coalesced",
            Op::Broadcast { .. } => "broadcast_coalesced",
            Op::Reduce { .. } => "reduce_coalesced",
            _ => "coalesced",
        }
    }

    /// How many buffers the op takes.
    pub const fn buffers(self) -> usize {
        match self {
            Op::Barrier => 0,
            Op::AllReduce(_)
            | Op::Broadcast { .. }
            | Op::Reduce { .. }
            | Op::Send { .. }
            | Op::Recv { .. } => 1,
            Op::AllGather | Op::ReduceScatter(_) | Op::AllToAll | Op::SendRecv { .. } => 2,
        }
    }

    /// True for ops every rank of the group takes part in (their sequence
    /// numbers are comparable across ranks); false for point-to-point ops.
    pub const fn is_collective(self) -> bool {
        !matches!(
            self,
            Op::Send { .. } | Op::Recv { .. } | Op::SendRecv { .. }
        )
    }

    /// True for the one-buffer ops that can be coalesced (several buffers
    /// reduced or broadcast as one op).
    pub const fn coalescable(self) -> bool {
        matches!(
            self,
            Op::AllReduce(_) | Op::Broadcast { .. } | Op::Reduce { .. }
        )
    }

    /// The root of a rooted collective, or the peer of a point-to-point
    /// op.
    pub const fn peer(self) -> Option<usize> {
        match self {
            Op::Broadcast { root } | Op::Reduce { root, .. } => Some(root),
            Op::Send { peer } | Op::Recv { peer } | Op::SendRecv { peer } => Some(peer),
            _ => None,
        }
    }

    /// The op with its root or peer replaced by `peer` (for the GPU layer,
    /// which names a pair's ranks 0 and 1); ops without one are returned
    /// as they are.
    pub const fn with_peer(self, peer: usize) -> Op {
        match self {
            Op::Broadcast { .. } => Op::Broadcast { root: peer },
            Op::Reduce { op, .. } => Op::Reduce { root: peer, op },
            Op::Send { .. } => Op::Send { peer },
            Op::Recv { .. } => Op::Recv { peer },
            Op::SendRecv { .. } => Op::SendRecv { peer },
            other => other,
        }
    }

    /// The reduction, for reducing ops.
    pub const fn reduction(self) -> Option<ReduceOp> {
        match self {
            Op::AllReduce(r) | Op::ReduceScatter(r) | Op::Reduce { op: r, .. } => Some(r),
            _ => None,
        }
    }

    /// Checks the op against `nranks` ranks and the element counts of its
    /// buffers, in order: the number of buffers, the root or peer, and how
    /// the counts of input and output relate. The text says what is wrong
    /// and what was expected.
    ///
    /// # Errors
    ///
    /// The first rule the op breaks.
    pub fn check(self, nranks: usize, counts: &[usize]) -> Result<(), String> {
        if counts.len() != self.buffers() {
            return Err(format!(
                "{} takes {} buffer(s), got {}",
                self.name(),
                self.buffers(),
                counts.len()
            ));
        }
        match self {
            Op::Broadcast { root } | Op::Reduce { root, .. } if root >= nranks => {
                return Err(format!(
                    "root {root} is not a rank of a group of size {nranks}"
                ))
            }
            Op::Send { peer } | Op::Recv { peer } | Op::SendRecv { peer } if peer >= nranks => {
                return Err(format!(
                    "peer {peer} is not a rank of a group of size {nranks}"
                ))
            }
            _ => {}
        }
        let (i, o) = match counts {
            [i, o] => (*i, *o),
            _ => return Ok(()),
        };
        let n = nranks;
        match self {
            Op::AllGather if Some(o) != i.checked_mul(n) => Err(format!(
                "all_gather output has {o} elements; expected size × input = {n} × {i} = {}",
                i.saturating_mul(n)
            )),
            Op::ReduceScatter(_) if Some(i) != o.checked_mul(n) => Err(format!(
                "reduce_scatter input has {i} elements; expected size × output = {n} × {o} = {}",
                o.saturating_mul(n)
            )),
            Op::AllToAll if i != o || i % n != 0 => Err(format!(
                "all_to_all input has {i} and output {o} elements; both must be the same \
                 multiple of the group size {n}"
            )),
            Op::SendRecv { .. } if i != o => Err(format!(
                "send_recv buffers have {i} and {o} elements; they must match"
            )),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn wire_bytes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_u8(d as u8), Some(d));
        }
        for r in ReduceOp::ALL {
            assert_eq!(ReduceOp::from_u8(r as u8), Some(r));
        }
        assert_eq!(DType::from_u8(10), None);
        assert_eq!(ReduceOp::from_u8(5), None);
    }

    #[test]
    fn shapes_are_checked_against_the_group_size() {
        assert!(Op::AllGather.check(3, &[4, 12]).is_ok());
        let e = Op::AllGather.check(3, &[4, 11]).unwrap_err();
        assert!(e.contains("expected size × input = 3 × 4 = 12"), "{e}");
        assert!(Op::ReduceScatter(ReduceOp::Sum).check(2, &[6, 3]).is_ok());
        assert!(Op::ReduceScatter(ReduceOp::Sum).check(2, &[6, 4]).is_err());
        assert!(Op::AllToAll.check(4, &[8, 8]).is_ok());
        assert!(Op::AllToAll.check(4, &[6, 6]).is_err());
        assert!(Op::AllToAll.check(4, &[8, 4]).is_err());
        assert!(Op::SendRecv { peer: 0 }.check(1, &[5, 5]).is_ok());
        assert!(Op::SendRecv { peer: 0 }.check(1, &[5, 4]).is_err());
        let e = Op::Broadcast { root: 2 }.check(2, &[1]).unwrap_err();
        assert!(e.contains("root 2"), "{e}");
        let e = Op::Recv { peer: 5 }.check(2, &[1]).unwrap_err();
        assert!(e.contains("peer 5"), "{e}");
        let e = Op::AllReduce(ReduceOp::Max).check(2, &[1, 1]).unwrap_err();
        assert!(e.contains("takes 1 buffer(s), got 2"), "{e}");
        assert!(Op::Barrier.check(2, &[]).is_ok());
        // An overflowing product is a mismatch, not a panic.
        assert!(Op::AllGather.check(3, &[usize::MAX, 0]).is_err());
    }

    #[test]
    fn peers_are_renamed_only_where_an_op_has_one() {
        assert_eq!(Op::Send { peer: 7 }.with_peer(1), Op::Send { peer: 1 });
        assert_eq!(
            Op::Reduce {
                root: 3,
                op: ReduceOp::Min
            }
            .with_peer(0),
            Op::Reduce {
                root: 0,
                op: ReduceOp::Min
            }
        );
        assert_eq!(Op::AllGather.with_peer(1), Op::AllGather);
        assert!(!Op::SendRecv { peer: 0 }.is_collective());
        assert!(Op::Barrier.is_collective());
    }
}
