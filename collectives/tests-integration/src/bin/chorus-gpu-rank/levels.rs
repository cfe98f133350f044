//! `levels`: the three completion levels across ranks. Rank `r`'s input
//! becomes ready `(r + 1) × 30 ms` after it calls the op (a spin kernel on
//! its producer stream ahead of it), so the op cannot end before the last
//! rank's input is ready, and:
//!
//! * Enqueued: the call returns with the work neither finished nor its
//!   end event complete;
//! * StreamOrdered: `stream_ordered()` gives the buffer back at once, and
//!   a kernel issued after it on the producer stream (add one) sees the
//!   reduced result, not the input;
//! * GpuFinished: `.await` (and `wait_timeout`) return once the op ended
//!   on every rank: the result is read on another stream with no wait,
//!   and rank 0's wait lasted at least until the last rank's input was
//!   ready.

use std::time::{Duration, Instant};

use chorus::test_util::Kernels;
use chorus::{Device, ProcessGroup, ReduceOp, Stream, StreamPriority, WorkStatus};
use tests_integration::testkit::{data, reference};

use super::checker::Checker;
use super::support::{rej, up, werr, Res};

const LEN: usize = 1 << 16;
const STEP: Duration = Duration::from_millis(30);

pub(super) async fn levels(pg: &ProcessGroup, s: &Stream, dev: &Device) -> Res<Checker> {
    let mut ck = Checker::default();
    let (rank, n) = (pg.rank(), pg.size());
    let k = Kernels::load(dev).map_err(|e| format!("kernels: {e}"))?;
    let other = dev
        .new_stream(StreamPriority::Normal)
        .map_err(|e| format!("stream: {e}"))?;
    let delay = STEP * (rank as u32 + 1);
    let last_ready = STEP * n as u32;
    let cuda = |what: &'static str| move |e: chorus::cuda::CudaError| format!("{what}: {e}");
    for round in 0..2u64 {
        let c = 8_800 + 10 * round;
        let sum = reference::<f32>(c, n, LEN, ReduceOp::Sum);

        // Enqueued, then StreamOrdered.
        let input = up(s, &data::<f32>(c, rank, LEN, ReduceOp::Sum))?;
        barrier(pg).await?;
        k.spin(s, delay).map_err(cuda("spin"))?;
        let w = pg
            .all_reduce(input, ReduceOp::Sum)
            .map_err(rej("all_reduce (enqueued)"))?;
        let done_early =
            w.status() == WorkStatus::Finished || w.gpu_finished().map_err(cuda("gpu_finished"))?;
        ck.count(
            format!(
                "round {round}: enqueued, not finished (status {:?})",
                w.status()
            ),
            !done_early,
            "the work said finished before its input was ready".into(),
        );
        let buf = w
            .stream_ordered()
            .map_err(werr("all_reduce (stream_ordered)"))?;
        let mut plus = s.alloc_zeros::<f32>(LEN).map_err(cuda("alloc"))?;
        k.add_one(s, buf.slice(), &mut plus)
            .map_err(cuda("add_one"))?;
        let got = s.clone_dtoh(&plus).map_err(cuda("read"))?;
        let want: Vec<f32> = sum.iter().map(|v| v + 1.0).collect();
        ck.check(
            format!("round {round}: stream_ordered, then add_one on the producer stream"),
            &got,
            &want,
        );

        // GpuFinished: await.
        let c2 = c + 1;
        let input = up(s, &data::<f32>(c2, rank, LEN, ReduceOp::Sum))?;
        barrier(pg).await?;
        k.spin(s, delay).map_err(cuda("spin"))?;
        let t0 = Instant::now();
        let b = pg
            .all_reduce(input, ReduceOp::Sum)
            .map_err(rej("all_reduce (await)"))?
            .await
            .map_err(werr("all_reduce (await)"))?;
        let waited = t0.elapsed();
        // Read on another stream that waits for nothing.
        let got = other.clone_dtoh(b.slice()).map_err(cuda("read"))?;
        ck.check(
            format!("round {round}: awaited, read on another stream"),
            &got,
            &reference::<f32>(c2, n, LEN, ReduceOp::Sum),
        );
        println!(
            "LEVELS rank={rank} round={round} own_delay_ms={} last_ready_ms={} awaited_ms={:.1}",
            delay.as_millis(),
            last_ready.as_millis(),
            waited.as_secs_f64() * 1e3
        );
        if rank == 0 {
            // The ranks started within a barrier's skew of each other.
            let floor = last_ready.saturating_sub(Duration::from_millis(10));
            ck.count(
                format!("round {round}: rank 0's await outlasted the last rank's input"),
                waited >= floor,
                format!("awaited {waited:?}, the last input was ready after {last_ready:?}"),
            );
        }

        // GpuFinished: a blocking wait.
        let c3 = c + 2;
        let input = up(s, &data::<f32>(c3, rank, LEN, ReduceOp::Sum))?;
        barrier(pg).await?;
        k.spin(s, delay).map_err(cuda("spin"))?;
        let b = pg
            .all_reduce(input, ReduceOp::Sum)
            .map_err(rej("all_reduce (wait_timeout)"))?
            .wait_timeout(Duration::from_secs(30))
            .map_err(werr("all_reduce (wait_timeout)"))?;
        let got = other.clone_dtoh(b.slice()).map_err(cuda("read"))?;
        ck.check(
            format!("round {round}: wait_timeout, read on another stream"),
            &got,
            &reference::<f32>(c3, n, LEN, ReduceOp::Sum),
        );
    }
    Ok(ck)
}

async fn barrier(pg: &ProcessGroup) -> Res<()> {
    pg.barrier()
        .map_err(rej("barrier"))?
        .await
        .map_err(werr("barrier"))?;
    Ok(())
}
