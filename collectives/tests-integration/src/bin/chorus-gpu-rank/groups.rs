//! `groups`: a group of mixed collectives and a ring of send/recv on
//! device buffers, a CUDA graph of a group replayed with fresh inputs, and
//! 16 × 1 MiB all_reduces issued one by one and as a group (their host
//! submit and total times).

use std::time::Instant;

use chorus::{DeviceBuffer, ProcessGroup, ReduceOp, Stream};
use tests_integration::testkit::{data, poison, reference};

use super::checker::Checker;
use super::support::{down, env_num, rej, up, werr, Res};

pub(super) async fn groups(pg: &ProcessGroup, s: &Stream) -> Res<Checker> {
    let (rank, n) = (pg.rank(), pg.size());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let mut ck = Checker::default();
    let e = |what: &'static str| {
        move |r: chorus::Rejected<DeviceBuffer<f32>>| format!("{what}: {}", r.error)
    };
    for round in 0..3u64 {
        let c = 900 + 10 * round;
        let (a, b, rx, tx, g2) = {
            let mut g = pg.batch();
            let rx = g
                .recv(up(s, &poison::<f32>(777))?, prev)
                .map_err(e("recv"))?;
            let a = g
                .all_reduce(
                    up(s, &data::<f32>(c, rank, 4099, ReduceOp::Sum))?,
                    ReduceOp::Sum,
                )
                .map_err(e("all_reduce"))?;
            let b = g
                .all_reduce(
                    up(s, &data::<i64>(c + 1, rank, 13, ReduceOp::Max))?,
                    ReduceOp::Max,
                )
                .map_err(|r| format!("all_reduce max: {}", r.error))?;
            let tx = g
                .send(up(s, &data::<f32>(c + 2, rank, 777, ReduceOp::Sum))?, next)
                .map_err(e("send"))?;
            let g2 = g
                .all_gather(
                    up(s, &data::<f32>(c + 3, rank, 5, ReduceOp::Sum))?,
                    up(s, &poison::<f32>(5 * n))?,
                )
                .map_err(|r| format!("all_gather: {}", r.error))?;
            g.launch().map_err(|e| format!("launch: {e}"))?;
            (a, b, rx, tx, g2)
        };
        let a = a.await.map_err(werr("grouped all_reduce"))?;
        ck.check(
            format!("group round {round} all_reduce sum f32"),
            &down(&a)?,
            &reference::<f32>(c, n, 4099, ReduceOp::Sum),
        );
        let b = b.await.map_err(werr("grouped all_reduce max"))?;
        ck.check(
            format!("group round {round} all_reduce max i64"),
            &down(&b)?,
            &reference::<i64>(c + 1, n, 13, ReduceOp::Max),
        );
        let rx = rx.await.map_err(werr("grouped recv"))?;
        ck.check(
            format!("group round {round} recv from {prev}"),
            &down(&rx)?,
            &data::<f32>(c + 2, prev, 777, ReduceOp::Sum),
        );
        tx.await.map_err(werr("grouped send"))?;
        let (_, out) = g2.await.map_err(werr("grouped all_gather"))?;
        let want: Vec<f32> = (0..n)
            .flat_map(|q| data::<f32>(c + 3, q, 5, ReduceOp::Sum))
            .collect();
        ck.check(
            format!("group round {round} all_gather"),
            &down(&out)?,
            &want,
        );
    }

    // Coalesced all_reduce: one op, one work, the buffers back in order.
    for (round, op) in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max]
        .into_iter()
        .enumerate()
    {
        let c = 950 + 10 * round as u64;
        let lens = [1usize, 4099, 13, 1 << 18];
        let bufs = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| up(s, &data::<f32>(c + i as u64, rank, len, op)))
            .collect::<Res<Vec<_>>>()?;
        let w = pg
            .all_reduce_coalesced(bufs, op)
            .map_err(|r| format!("all_reduce_coalesced: {}", r.error))?;
        let out = w.await.map_err(werr("all_reduce_coalesced"))?;
        for (i, (b, &len)) in out.iter().zip(&lens).enumerate() {
            ck.check_reduced(
                format!("coalesced {op:?} buffer {i} ({len} f32)"),
                &down(b)?,
                &reference::<f32>(c + i as u64, n, len, op),
                op,
                n,
            );
        }
    }

    // Capture: a group of 4 all_reduces and a send/recv ring, replayed 5
    // times with fresh inputs.
    let len = 1 << 16;
    let zeros = vec![0f32; len];
    let ar: Vec<DeviceBuffer<f32>> = (0..4).map(|_| up(s, &zeros)).collect::<Res<_>>()?;
    let (sbuf, rbuf) = (up(s, &zeros)?, up(s, &zeros)?);
    s.synchronize().map_err(|e| format!("sync: {e}"))?;
    let mut cap = pg.capture(s).map_err(|e| format!("capture: {e}"))?;
    let (tickets, st, rt) = cap
        .batch(|g| {
            let mut t = Vec::new();
            for b in ar {
                t.push(g.all_reduce(b, ReduceOp::Sum)?);
            }
            let rt = g.recv(rbuf, prev)?;
            let st = g.send(sbuf, next)?;
            Ok((t, st, rt))
        })
        .map_err(|e| format!("capture group: {e}"))?;
    let mut graph = cap.finish().map_err(|e| format!("finish: {e}"))?;
    for replay in 0..5u64 {
        let c = 5000 + 10 * replay;
        for (i, t) in tickets.iter().enumerate() {
            let b = graph.buffers_mut(*t).ok_or("ticket")?;
            s.copy_htod(
                &data::<f32>(c + i as u64, rank, len, ReduceOp::Sum),
                b.slice_mut(),
            )
            .map_err(|e| format!("fill: {e}"))?;
        }
        let b = graph.buffers_mut(st).ok_or("ticket")?;
        s.copy_htod(&data::<f32>(c + 9, rank, len, ReduceOp::Sum), b.slice_mut())
            .map_err(|e| format!("fill: {e}"))?;
        graph.launch(s).map_err(|e| format!("replay: {e}"))?;
        graph
            .done_event()
            .synchronize()
            .map_err(|e| format!("replay sync: {e}"))?;
        for (i, t) in tickets.iter().enumerate() {
            let b = graph.buffers(*t).ok_or("ticket")?;
            let got = s.clone_dtoh(b.slice()).map_err(|e| format!("read: {e}"))?;
            ck.check(
                format!("replay {replay} all_reduce {i}"),
                &got,
                &reference::<f32>(c + i as u64, n, len, ReduceOp::Sum),
            );
        }
        let b = graph.buffers(rt).ok_or("ticket")?;
        let got = s.clone_dtoh(b.slice()).map_err(|e| format!("read: {e}"))?;
        ck.check(
            format!("replay {replay} recv"),
            &got,
            &data::<f32>(c + 9, prev, len, ReduceOp::Sum),
        );
    }
    drop(graph);

    // 16 × 1 MiB: one by one, as a group, as one coalesced op.
    let mut bufs: Vec<Option<DeviceBuffer<f32>>> = (0..16)
        .map(|_| up(s, &vec![1f32; 262_144]).map(Some))
        .collect::<Res<_>>()?;
    // `GROUPS_ITERS` (default 120, the first sixth untimed): fewer where
    // the figures mean nothing (ranks sharing one GPU).
    let iters = env_num("GROUPS_ITERS", 120).max(2) as usize;
    let warm = iters / 6;
    for mode in ["sequential", "grouped", "coalesced"] {
        let grouped = mode == "grouped";
        let mut sub = Vec::new();
        let mut tot = Vec::new();
        for it in 0..iters {
            pg.barrier()
                .map_err(rej("barrier"))?
                .await
                .map_err(werr("barrier"))?;
            let t0 = Instant::now();
            if mode == "coalesced" {
                let taken: Vec<_> = bufs.iter_mut().filter_map(Option::take).collect();
                let w = pg
                    .all_reduce_coalesced(taken, ReduceOp::Avg)
                    .map_err(|r| format!("all_reduce_coalesced: {}", r.error))?;
                let t1 = Instant::now();
                let out = w.await.map_err(werr("16x1MiB coalesced"))?;
                for (slot, b) in bufs.iter_mut().zip(out) {
                    *slot = Some(b);
                }
                if it >= warm {
                    sub.push((t1 - t0).as_secs_f64() * 1e6);
                    tot.push(t0.elapsed().as_secs_f64() * 1e6);
                }
                continue;
            }
            let works: Vec<_> = if grouped {
                let mut g = pg.batch();
                let ws: Vec<_> = bufs
                    .iter_mut()
                    .filter_map(Option::take)
                    .map(|b| g.all_reduce(b, ReduceOp::Avg).map_err(e("all_reduce")))
                    .collect::<Result<_, _>>()?;
                g.launch().map_err(|e| format!("launch: {e}"))?;
                let mut out = Vec::new();
                for w in ws {
                    out.push(w.into_work().map_err(werr("into_work"))?);
                }
                out
            } else {
                bufs.iter_mut()
                    .filter_map(Option::take)
                    .map(|b| pg.all_reduce(b, ReduceOp::Avg).map_err(e("all_reduce")))
                    .collect::<Result<_, _>>()?
            };
            let t1 = Instant::now();
            for (slot, w) in bufs.iter_mut().zip(works) {
                *slot = Some(w.await.map_err(werr("16x1MiB"))?);
            }
            if it >= warm {
                sub.push((t1 - t0).as_secs_f64() * 1e6);
                tot.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        sub.sort_by(f64::total_cmp);
        tot.sort_by(f64::total_cmp);
        println!(
            "WIDTH16 rank={rank} mode={mode} submit_us={:.1} total_us={:.1}",
            sub[sub.len() / 2],
            tot[tot.len() / 2]
        );
    }
    Ok(ck)
}
