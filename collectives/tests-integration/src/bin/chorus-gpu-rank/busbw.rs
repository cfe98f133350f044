//! `busbw`: all_reduce f32 from 8 B to 1 GiB, one JSON line per size
//! (round trip, host submit, pipelined loop, bus bandwidth).

use std::time::Instant;

use chorus::test_util::in_progress_returns;
use chorus::{DeviceBuffer, ProcessGroup, ReduceOp, Stream};

use super::support::{env_num, rej, up, werr, Res};

fn median_of(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub(super) async fn busbw(pg: &ProcessGroup, s: &Stream) -> Res<()> {
    let (rank, size) = (pg.rank(), pg.size());
    let iters = env_num("BUSBW_ITERS", 20) as usize;
    let max = 1usize << 30;
    let mut sizes: Vec<usize> = (0..14).map(|k| 8usize << (2 * k)).collect();
    sizes.push(max);
    let factor = 2.0 * (size as f64 - 1.0) / size as f64;
    for bytes in sizes {
        let n = bytes / 4;
        let mut part = up(s, &vec![1.0f32; n])?;
        s.synchronize().map_err(|e| format!("sync: {e}"))?;
        let run = |b: DeviceBuffer<f32>| pg.all_reduce(b, ReduceOp::Sum).map_err(rej("busbw"));
        for _ in 0..5 {
            part = run(part)?.await.map_err(werr("busbw"))?;
        }
        pg.barrier()
            .map_err(rej("barrier"))?
            .await
            .map_err(werr("barrier"))?;
        let mut times = Vec::with_capacity(iters);
        let mut submits = Vec::with_capacity(iters);
        let in_progress_before = in_progress_returns();
        for _ in 0..iters {
            let t = Instant::now();
            let w = run(part)?;
            submits.push(t.elapsed().as_secs_f64() * 1e6);
            part = w.await.map_err(werr("busbw"))?;
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let in_progress = in_progress_returns() - in_progress_before;
        let median = median_of(&mut times);
        let submit = median_of(&mut submits);
        pg.barrier()
            .map_err(rej("barrier"))?
            .await
            .map_err(werr("barrier"))?;
        // Pipelined: `iters` ops back to back, each taking the previous
        // one's buffer stream-ordered (no host wait), then await the last.
        let t = Instant::now();
        let mut b = part;
        for i in 0..iters {
            let w = run(b)?;
            b = if i + 1 == iters {
                w.await.map_err(werr("busbw"))?
            } else {
                w.stream_ordered().map_err(werr("busbw"))?
            };
        }
        let pipelined = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
        drop(b);
        let bw = |us: f64| bytes as f64 * factor / (us * 1e-6) / 1e9;
        if rank == 0 {
            println!(
                "{{\"bytes\":{bytes},\"median_us\":{median:.2},\"submit_us\":{submit:.2},\"in_progress\":{in_progress},\"busbw_gbps\":{:.2},\"loop_us\":{pipelined:.2},\"loop_busbw_gbps\":{:.2},\"iters\":{iters},\"ranks\":{size}}}",
                bw(median),
                bw(pipelined)
            );
        }
    }
    Ok(())
}
