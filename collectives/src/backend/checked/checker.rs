//! [`Checker`]: gathers every rank's signatures of a launch through the
//! TCP backend and compares them.

use std::sync::Arc;
use std::time::Duration;

use chorus_core::{Op, OpContext, WorkError};

use super::signature::{describe, digest, Signature, NONE};
use crate::backend::tcp::TcpBackend;
use crate::sequence::{Counters, Sequencer};

/// The name of the exchange in errors and flight records.
const CHECK: &str = "check";

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
