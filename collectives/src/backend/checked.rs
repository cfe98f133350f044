//! The checked mode on device ops ([`GroupBuilder::check_ops`](crate::GroupBuilder::check_ops)):
//! NCCL compares nothing across ranks, so before a device collective (or a
//! group or coalesced launch of them) reaches NCCL, every rank's
//! signatures — op, dtype, count, root, reduction of each op — are gathered
//! through the group's TCP backend and compared. A launch the ranks called
//! differently is refused on every rank with [`WorkError::Mismatch`] naming
//! both sides, before anything reaches NCCL, so it neither hangs nor
//! corrupts; the group stays usable (nothing ran, and every rank refused
//! the same launch).
//!
//! The exchange is one of chorus's own ops (`check`, numbered apart from
//! the program's ops): an all_gather of two numbers per rank (how many ops,
//! a digest of their signatures), and only when the digests differ, a
//! second one of the signatures themselves, to name both sides. The
//! submitting thread waits for it under the group's submission lock, so
//! launches keep their program order; its cost per op is in
//! benches/RESULTS.md.

use std::sync::Arc;
use std::time::Duration;

use chorus_core::flight_recorder::OpMeta;
use chorus_core::{DType, Op, OpContext, ReduceOp, WorkError};

use super::tcp::TcpBackend;
use crate::sequence::{Counters, Sequencer};

/// The name of the exchange in errors and flight records.
const CHECK: &str = "check";

/// What every rank must agree on of one device op: op code, dtype code,
/// count, root or peer (`u64::MAX`: none), reduction code (`u64::MAX`:
/// none).
pub(crate) type Signature = [u64; 5];

const NONE: u64 = u64::MAX;

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
fn describe(s: &Signature) -> String {
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
fn digest(sigs: &[Signature]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in sigs.iter().flatten() {
        for b in v.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Compares the device signatures of one group's ranks before launch.
#[derive(Debug)]
pub(crate) struct Checker {
    tcp: Arc<TcpBackend>,
    timeout: Duration,
}

impl Checker {
    /// A checker that gathers through `tcp`, each exchange bounded by
    /// `timeout`.
    pub(crate) fn new(tcp: Arc<TcpBackend>, timeout: Duration) -> Checker {
        Checker { tcp, timeout }
    }

    /// Gathers `sigs` — the ops of one launch of this rank, the first at
    /// `ctx` — from every rank and compares them, under the submission
    /// lock `counters`.
    ///
    /// # Errors
    ///
    /// [`WorkError::Mismatch`] naming both sides when a rank's launch
    /// differs; the exchange's own error (a lost peer, a timeout) when it
    /// fails.
    pub(crate) fn verify(
        &self,
        seq: &Sequencer,
        counters: &mut Counters,
        ctx: &OpContext,
        sigs: &[Signature],
    ) -> Result<(), WorkError> {
        let n = seq.size();
        if n == 1 {
            return Ok(());
        }
        let me = seq.rank();
        let mine = [sigs.len() as u64, digest(sigs)];
        let all = self.gather(seq, counters, mine.to_vec(), n)?;
        if all.chunks(2).all(|d| d == mine) {
            return Ok(());
        }
        let mismatch = |detail: String| WorkError::Mismatch {
            ctx: ctx.clone(),
            detail,
        };
        if let Some((r, d)) = all.chunks(2).enumerate().find(|(_, d)| d[0] != mine[0]) {
            return Err(mismatch(format!(
                "rank {r} at seq {} launched {} device op(s) but rank {me} launched {}",
                ctx.seq, d[0], mine[0]
            )));
        }
        let flat: Vec<u64> = sigs.iter().flatten().copied().collect();
        let width = flat.len();
        let all = self.gather(seq, counters, flat, n)?;
        for (r, theirs) in all.chunks(width.max(1)).enumerate() {
            for (i, (t, o)) in theirs.chunks(5).zip(sigs).enumerate() {
                if t != o.as_slice() {
                    let t: Signature = t.try_into().unwrap_or([NONE; 5]);
                    return Err(mismatch(format!(
                        "rank {r} at seq {} called {} but rank {me} called {}",
                        ctx.seq + i as u64,
                        describe(&t),
                        describe(o)
                    )));
                }
            }
        }
        // The digests differ while the signatures do not: a rank's digest
        // was computed differently (another chorus version).
        Err(mismatch(format!(
            "the ranks' signatures of the launch at seq {} agree but their digests do not: run the same chorus version on every rank",
            ctx.seq
        )))
    }

    /// All ranks' `mine` (each `mine.len()` long), in rank order, through
    /// an all_gather of chorus's own on the TCP backend, waited for here.
    fn gather(
        &self,
        seq: &Sequencer,
        counters: &mut Counters,
        mine: Vec<u64>,
        n: usize,
    ) -> Result<Vec<u64>, WorkError> {
        let out = vec![0u64; n * mine.len()];
        let work = self
            .tcp
            .submit_own_locked(
                seq,
                counters,
                self.timeout,
                Op::AllGather,
                CHECK,
                (mine, out),
            )
            .map_err(|r| r.error)?;
        futures::executor::block_on(work)
            .map(|(_, all)| all)
            .map_err(|f| f.error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ProcessGroup;
    use chorus_store::{InMemoryStore, Store};

    /// Every rank of a checked group of `n` verifies `sigs(rank)` at once;
    /// their outcomes by rank.
    fn verify_all(n: usize, sigs: impl Fn(usize) -> Vec<Signature>) -> Vec<Result<(), WorkError>> {
        let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        let groups: Vec<ProcessGroup> =
            futures::executor::block_on(futures::future::join_all((0..n).map(|rank| {
                ProcessGroup::builder()
                    .rank(rank)
                    .world_size(n)
                    .store(store.clone())
                    .peer_liveness(Duration::ZERO)
                    .check_ops(true)
                    .build()
            })))
            .into_iter()
            .map(|g| g.expect("group setup"))
            .collect();
        let threads: Vec<_> = groups
            .into_iter()
            .enumerate()
            .map(|(r, g)| {
                let mine = sigs(r);
                std::thread::spawn(move || {
                    let seq = &g.inner.seq;
                    let mut counters = seq.lock();
                    let ctx = seq.ctx(counters.next(Op::Barrier), "all_reduce");
                    let checker = g.inner.nccl.checker.as_ref().expect("checked mode");
                    checker.verify(seq, &mut counters, &ctx, &mine)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("rank thread"))
            .collect()
    }

    fn detail(r: &Result<(), WorkError>) -> String {
        match r {
            Err(WorkError::Mismatch { detail, .. }) => detail.clone(),
            other => panic!("expected a mismatch, got {other:?}"),
        }
    }

    #[test]
    fn agreeing_launches_pass_and_differing_ones_fail_on_every_rank() {
        let ar = |count| signature(Op::AllReduce(ReduceOp::Sum), Some(DType::F32), count);
        for r in verify_all(3, |_| vec![ar(8), ar(4)]) {
            assert!(r.is_ok(), "{r:?}");
        }
        // One rank's second op is longer: every rank names both sides.
        let got = verify_all(3, |rank| vec![ar(8), ar(if rank == 2 { 5 } else { 4 })]);
        assert!(
            detail(&got[0]).contains("rank 2 at seq 2 called all_reduce(count=5"),
            "{got:?}"
        );
        assert!(
            detail(&got[2]).contains("rank 0 at seq 2 called all_reduce(count=4"),
            "{got:?}"
        );
        assert!(
            detail(&got[2]).contains("but rank 2 called all_reduce(count=5"),
            "{got:?}"
        );
        // One rank launches another number of ops.
        let got = verify_all(3, |rank| vec![ar(8); if rank == 1 { 2 } else { 1 }]);
        for r in &got {
            assert!(detail(r).contains("device op(s)"), "{got:?}");
        }
        // Roots differ.
        let bc = |root| signature(Op::Broadcast { root }, Some(DType::F32), 8);
        let got = verify_all(2, |rank| vec![bc(rank)]);
        assert!(
            detail(&got[1]).contains("root=0") && detail(&got[1]).contains("root=1"),
            "{got:?}"
        );
    }

    #[test]
    fn signatures_tell_every_field_apart() {
        let base = signature(Op::AllReduce(ReduceOp::Sum), Some(DType::F32), 8);
        let others = [
            signature(Op::AllReduce(ReduceOp::Max), Some(DType::F32), 8),
            signature(Op::AllReduce(ReduceOp::Sum), Some(DType::F64), 8),
            signature(Op::AllReduce(ReduceOp::Sum), Some(DType::F32), 9),
            signature(Op::Broadcast { root: 0 }, Some(DType::F32), 8),
            signature(
                Op::Reduce {
                    root: 0,
                    op: ReduceOp::Sum,
                },
                Some(DType::F32),
                8,
            ),
        ];
        for o in others {
            assert_ne!(base, o);
            assert_ne!(digest(&[base]), digest(&[o]));
        }
        assert_ne!(
            signature(Op::Broadcast { root: 0 }, Some(DType::F32), 8),
            signature(Op::Broadcast { root: 1 }, Some(DType::F32), 8)
        );
        assert_eq!(describe(&base), "all_reduce(count=8, dtype=f32, op=sum)");
        assert_eq!(
            describe(&signature(Op::Broadcast { root: 2 }, Some(DType::I32), 3)),
            "broadcast(count=3, dtype=i32, root=2)"
        );
    }
}
