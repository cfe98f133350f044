//! A rank program for chorus's multi-GPU checks of the NCCL backend: started
//! by `chorus-run`, one process per GPU (device = `LOCAL_RANK`), or several
//! on one GPU (`chorus-run --share-gpu`), it runs one scenario and reports
//! on stdout. Not an example to copy.
//!
//! Scenarios (first argument):
//! * `matrix`: every op (all_reduce / reduce / reduce_scatter × sum prod min
//!   max avg, broadcast, all_gather, all_to_all, send/recv both ways,
//!   send_recv) × dtype (f32 f64 f16 bf16 i8 u8 i32 i64) on device buffers
//!   with random data and poisoned outputs, checked against the serial
//!   reference; then subgroups made by `new_group` (a split of the world
//!   communicator) doing an all_reduce. Prints `OK rank=R checks=N` or one
//!   `MISMATCH` line per failed check and `FAIL rank=R ...`.
//! * `groups`: a group of mixed collectives and a ring of send/recv (the
//!   recv staged first) on device buffers, checked against the reference;
//!   a CUDA graph capturing a group of 4 all_reduces and a send/recv ring,
//!   replayed 5 times with fresh inputs and checked after each replay; and
//!   16 × 1 MiB all_reduces issued one by one and as a group (median host
//!   submit and total µs over `GROUPS_ITERS` rounds, default 120). Prints
//!   `OK rank=R checks=N` or `FAIL ...`.
//! * `seed`: three groups of the same ranks, each running a collective and
//!   send/recv over every pair, twice: communicator creations counted
//!   against the design's (one per group for collectives, one per pair,
//!   none on later ops). Prints `SEED` lines, then `OK` or `FAIL`.
//! * `levels`: the three completion levels across ranks whose inputs are
//!   ready at different times (enqueued, stream-ordered, GPU-finished).
//! * `checked` (with `CHORUS_CHECK_OPS=1`): device collectives called
//!   differently (roots, counts, a group's size) are refused on every rank
//!   with `Mismatch` before NCCL sees them; the group stays usable.
//! * `kill` / `stop`: rank `FAULT_RANK` (default 1) SIGKILLs / SIGSTOPs
//!   itself mid all_reduce; the survivors must fail within the peer
//!   liveness timeout (`CHORUS_PEER_LIVENESS_MS`) and a second with
//!   `PeerLost` / `PeerSilent` naming it, re-form without it
//!   (`FAULT_WINDOW_MS`, default 2000) and pass checked ops on the new
//!   group. Prints `RESULT` and `REFORM` lines (how the new communicator
//!   came: `shrunk` or `fresh`). Run under `chorus-run --keep-going`.
//! * `rejoin`: under `chorus-run --max-restarts 1`, training steps with
//!   rank `FAULT_RANK` killed in one; the replacement rejoins, and the
//!   parameters end bit-identical on every rank and equal to the serial
//!   reference of the steps.
//! * `busbw`: all_reduce f32 from 8 B to 1 GiB; prints one JSON line per size
//!   (`bytes`, `median_us` of submit-to-await round trips, `submit_us` the
//!   median host time of the `all_reduce` call alone, `in_progress` how many
//!   of the timed calls returned `ncclInProgress`, `loop_us` per op of 20
//!   back-to-back ops, `busbw_gbps` from each).
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use chorus::reduce::Reducible;
use chorus::test_util::in_progress_returns;
use chorus::DeviceElement;
use chorus::{Device, Stream, StreamPriority};
use chorus::{DeviceBuffer, ProcessGroup, ReduceOp};
use chorus_examples::testkit::{data, poison, reference, TestElem, OPS};
use half::{bf16, f16};

fn env_num(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

type Res<T> = Result<T, String>;

fn up<T: DeviceElement + Copy>(s: &Stream, v: &[T]) -> Res<DeviceBuffer<T>> {
    let slice = s.clone_htod(v).map_err(|e| format!("upload: {e}"))?;
    DeviceBuffer::new(slice).map_err(|e| format!("device buffer: {e}"))
}

fn down<T: DeviceElement + Copy>(b: &DeviceBuffer<T>) -> Res<Vec<T>> {
    b.producer()
        .clone_dtoh(b.slice())
        .map_err(|e| format!("download: {e}"))
}

#[path = "chorus-gpu-rank/checked.rs"]
mod checked;
#[path = "chorus-gpu-rank/faults.rs"]
mod faults;
#[path = "chorus-gpu-rank/levels.rs"]
mod levels;
#[path = "chorus-gpu-rank/seed.rs"]
mod seed;

/// Counts checks and records mismatches (all of them, not only the first).
#[derive(Default)]
struct Checker {
    checks: usize,
    fails: Vec<String>,
}

impl Checker {
    /// A check that is a condition: `what` held, or failed as `detail`.
    fn count(&mut self, what: String, ok: bool, detail: String) {
        self.checks += 1;
        if !ok {
            self.fails.push(format!("{what}: {detail}"));
        }
    }

    fn check<T: PartialEq + std::fmt::Debug>(&mut self, what: String, got: &[T], want: &[T]) {
        self.checks += 1;
        if got.len() != want.len() {
            self.fails.push(format!(
                "{what}: {} elements, expected {}",
                got.len(),
                want.len()
            ));
            return;
        }
        let bad: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
        if let Some(&i) = bad.first() {
            self.fails.push(format!(
                "{what}: {} of {} elements differ; first at {i}: got {:?}, expected {:?}",
                bad.len(),
                got.len(),
                got[i],
                want[i]
            ));
        }
    }
}

fn werr<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> String + '_ {
    move |e| format!("{what}: work failed: {e}")
}

fn rej<B>(what: &str) -> impl Fn(chorus::Rejected<B>) -> String + '_ {
    move |e| format!("{what}: rejected: {}", e.error)
}

/// Every op for element type `T` at `len` elements per rank.
async fn ops<T>(pg: &ProcessGroup, s: &Stream, salt: u64, len: usize, ck: &mut Checker) -> Res<()>
where
    T: TestElem + Reducible + DeviceElement,
{
    let (rank, size) = (pg.rank(), pg.size());
    let dt = T::DTYPE;
    let case = |k: u64| salt * 1_000 + k;
    for (oi, &op) in OPS.iter().enumerate() {
        let c = case(oi as u64);
        let w = format!("all_reduce {op} {dt} len {len}");
        let b = pg
            .all_reduce(up(s, &data::<T>(c, rank, len, op))?, op)
            .map_err(rej(&w))?
            .await
            .map_err(werr(&w))?;
        ck.check(w, &down(&b)?, &reference::<T>(c, size, len, op));

        let c = case(20 + oi as u64);
        let root = (c as usize + 1) % size;
        let w = format!("reduce {op} {dt} len {len} root {root}");
        let b = pg
            .reduce(up(s, &data::<T>(c, rank, len, op))?, root, op)
            .map_err(rej(&w))?
            .await
            .map_err(werr(&w))?;
        if rank == root {
            ck.check(w, &down(&b)?, &reference::<T>(c, size, len, op));
        }

        let c = case(40 + oi as u64);
        let w = format!("reduce_scatter {op} {dt} len {len}");
        let (_, o) = pg
            .reduce_scatter(
                up(s, &data::<T>(c, rank, size * len, op))?,
                up(s, &poison::<T>(len))?,
                op,
            )
            .map_err(rej(&w))?
            .await
            .map_err(werr(&w))?;
        let full = reference::<T>(c, size, size * len, op);
        ck.check(w, &down(&o)?, &full[rank * len..(rank + 1) * len]);
    }

    let c = case(10);
    let root = (c as usize) % size;
    let w = format!("broadcast {dt} len {len} root {root}");
    let mine = if rank == root {
        data::<T>(c, rank, len, ReduceOp::Sum)
    } else {
        poison(len)
    };
    let b = pg
        .broadcast(up(s, &mine)?, root)
        .map_err(rej(&w))?
        .await
        .map_err(werr(&w))?;
    ck.check(w, &down(&b)?, &data::<T>(c, root, len, ReduceOp::Sum));

    let c = case(30);
    let w = format!("all_gather {dt} len {len}");
    let (i, o) = pg
        .all_gather(
            up(s, &data::<T>(c, rank, len, ReduceOp::Sum))?,
            up(s, &poison::<T>(size * len))?,
        )
        .map_err(rej(&w))?
        .await
        .map_err(werr(&w))?;
    let expect: Vec<T> = (0..size)
        .flat_map(|r| data::<T>(c, r, len, ReduceOp::Sum))
        .collect();
    ck.check(w.clone(), &down(&o)?, &expect);
    ck.check(
        format!("{w} input kept"),
        &down(&i)?,
        &data::<T>(c, rank, len, ReduceOp::Sum),
    );

    let c = case(50);
    let w = format!("all_to_all {dt} len {len}");
    let (_, o) = pg
        .all_to_all(
            up(s, &data::<T>(c, rank, size * len, ReduceOp::Sum))?,
            up(s, &poison::<T>(size * len))?,
        )
        .map_err(rej(&w))?
        .await
        .map_err(werr(&w))?;
    let expect: Vec<T> = (0..size)
        .flat_map(|i| {
            data::<T>(c, i, size * len, ReduceOp::Sum)[rank * len..(rank + 1) * len].to_vec()
        })
        .collect();
    ck.check(w, &down(&o)?, &expect);

    // send/recv: rank a sends to rank b, for every ordered pair in turn, so
    // that no rank posts a send and a recv on the same stream at once.
    for a in 0..size {
        for b in 0..size {
            if a == b {
                continue;
            }
            let c = case(60 + (a * size + b) as u64);
            let w = format!("send/recv {dt} len {len} {a}->{b}");
            if rank == a {
                pg.send(up(s, &data::<T>(c, a, len, ReduceOp::Sum))?, b)
                    .map_err(rej(&w))?
                    .await
                    .map_err(werr(&w))?;
            } else if rank == b {
                let got = pg
                    .recv(up(s, &poison::<T>(len))?, a)
                    .map_err(rej(&w))?
                    .await
                    .map_err(werr(&w))?;
                ck.check(w, &down(&got)?, &data::<T>(c, a, len, ReduceOp::Sum));
            }
        }
    }

    // send_recv: a ring exchange as one grouped op per rank.
    if size > 1 {
        let c = case(90);
        let next = (rank + 1) % size;
        let prev = (rank + size - 1) % size;
        if size == 2 {
            let w = format!("send_recv {dt} len {len} with {next}");
            let (_, got) = pg
                .send_recv(
                    up(s, &data::<T>(c, rank, len, ReduceOp::Sum))?,
                    up(s, &poison::<T>(len))?,
                    next,
                )
                .map_err(rej(&w))?
                .await
                .map_err(werr(&w))?;
            ck.check(w, &down(&got)?, &data::<T>(c, prev, len, ReduceOp::Sum));
        }
    }
    Ok(())
}

async fn all_dtypes(pg: &ProcessGroup, s: &Stream, len: usize, ck: &mut Checker) -> Res<()> {
    let salt = len as u64 * 10;
    ops::<f32>(pg, s, salt + 1, len, ck).await?;
    ops::<f64>(pg, s, salt + 2, len, ck).await?;
    ops::<f16>(pg, s, salt + 3, len, ck).await?;
    ops::<bf16>(pg, s, salt + 4, len, ck).await?;
    ops::<i8>(pg, s, salt + 5, len, ck).await?;
    ops::<u8>(pg, s, salt + 6, len, ck).await?;
    ops::<i32>(pg, s, salt + 7, len, ck).await?;
    ops::<i64>(pg, s, salt + 8, len, ck).await?;
    Ok(())
}

async fn matrix(pg: &ProcessGroup, s: &Stream) -> Res<Checker> {
    let rank = pg.rank();
    let mut ck = Checker::default();
    for len in [1usize, 13, 4099, 70_001] {
        all_dtypes(pg, s, len, &mut ck).await?;
    }
    // A large f32 all_reduce (4 Mi + 3 elements).
    ops_big(pg, s, &mut ck).await?;
    let world_comms = pg.nccl_comms_created();

    // Subgroups: the whole world (a split with every rank), then only the
    // last rank (the others take part in the split with NOCOLOR).
    let size = pg.size();
    let all: Vec<usize> = (0..size).collect();
    let sub = pg
        .new_group(&all)
        .await
        .map_err(|e| format!("new_group(all): {e}"))?
        .ok_or("new_group(all) gave no group to a member")?;
    let last = pg
        .new_group(&[size - 1])
        .await
        .map_err(|e| format!("new_group([last]): {e}"))?;
    for (name, g) in [("sub(all)", Some(&sub)), ("sub(last)", last.as_ref())] {
        let Some(g) = g else { continue };
        let c = 777 + g.size() as u64;
        let w = format!("{name} all_reduce sum f32 len 5003");
        let b = g
            .all_reduce(
                up(s, &data::<f32>(c, g.rank(), 5003, ReduceOp::Sum))?,
                ReduceOp::Sum,
            )
            .map_err(rej(&w))?
            .await
            .map_err(werr(&w))?;
        ck.check(
            w,
            &down(&b)?,
            &reference::<f32>(c, g.size(), 5003, ReduceOp::Sum),
        );
        println!(
            "SUBGROUP rank={rank} {name} size={} sub_rank={} comms_created={}",
            g.size(),
            g.rank(),
            g.nccl_comms_created()
        );
    }
    println!(
        "COMMS rank={rank} world={world_comms} after_subgroups={}",
        pg.nccl_comms_created()
    );
    pg.barrier()
        .map_err(rej("barrier"))?
        .await
        .map_err(werr("barrier"))?;
    Ok(ck)
}

async fn groups(pg: &ProcessGroup, s: &Stream) -> Res<Checker> {
    let (rank, n) = (pg.rank(), pg.size());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let mut ck = Checker::default();
    let e = |what: &'static str| {
        move |r: chorus::Rejected<DeviceBuffer<f32>>| format!("{what}: {}", r.error)
    };
    for round in 0..3u64 {
        let c = 900 + 10 * round;
        let (a, b, rx, tx, g2) = {
            let mut g = pg.group();
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
            ck.check(
                format!("coalesced {op:?} buffer {i} ({len} f32)"),
                &down(b)?,
                &reference::<f32>(c + i as u64, n, len, op),
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
        .group(|g| {
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
                let mut g = pg.group();
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

async fn ops_big(pg: &ProcessGroup, s: &Stream, ck: &mut Checker) -> Res<()> {
    let (rank, size) = (pg.rank(), pg.size());
    let len = (4 << 20) + 3;
    let w = format!("all_reduce sum f32 len {len}");
    let b = pg
        .all_reduce(
            up(s, &data::<f32>(4242, rank, len, ReduceOp::Sum))?,
            ReduceOp::Sum,
        )
        .map_err(rej(&w))?
        .await
        .map_err(werr(&w))?;
    ck.check(
        w,
        &down(&b)?,
        &reference::<f32>(4242, size, len, ReduceOp::Sum),
    );
    Ok(())
}

fn median_of(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

async fn busbw(pg: &ProcessGroup, s: &Stream) -> Res<()> {
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

/// Prints a scenario's outcome (`OK`, or each `MISMATCH` and `FAIL`) and
/// returns the exit code.
fn report(rank: usize, outcome: Res<Checker>, extra: &str) -> i32 {
    match outcome {
        Ok(ck) if ck.fails.is_empty() => {
            println!("OK rank={rank} checks={}{extra}", ck.checks);
            0
        }
        Ok(ck) => {
            for f in &ck.fails {
                println!("MISMATCH rank={rank} {f}");
            }
            println!(
                "FAIL rank={rank} {} of {} checks failed",
                ck.fails.len(),
                ck.checks
            );
            1
        }
        Err(e) => {
            println!("FAIL rank={rank} {e}");
            1
        }
    }
}

async fn main_async(scenario: &str) -> Result<i32, String> {
    let local: usize = env_num("LOCAL_RANK", 0) as usize;
    let dev = Device::get(local).map_err(|e| format!("device {local}: {e}"))?;
    let s = dev
        .new_stream(StreamPriority::Normal)
        .map_err(|e| format!("stream: {e}"))?;
    let t = Instant::now();
    let pg = ProcessGroup::builder()
        .timeout(Duration::from_secs(60))
        .device(local)
        .init_from_env()
        .await
        .map_err(|e| format!("group: {e}"))?;
    let rank = pg.rank();
    if rank == 0 {
        match nccl_sys::nccl() {
            Ok(n) => println!(
                "NCCL version={} path={} missing_optional={:?}",
                n.version(),
                n.path(),
                n.missing_optional()
            ),
            Err(e) => println!("NCCL unavailable: {e}"),
        }
    }
    println!(
        "START rank={rank} size={} device={local} pid={} init_ms={}",
        pg.size(),
        std::process::id(),
        t.elapsed().as_millis()
    );
    let code = match scenario {
        "seed" => report(rank, seed::seed(&pg, &s).await, ""),
        "levels" => report(rank, levels::levels(&pg, &s, &dev).await, ""),
        "checked" => report(rank, checked::checked(&pg, &s).await, ""),
        "kill" | "stop" | "rejoin" => {
            let run = match scenario {
                "kill" => faults::kill(&pg, &s).await,
                "stop" => faults::stop(&pg, &s).await,
                _ => faults::rejoin(pg.clone(), &s).await,
            };
            let (outcome, last) = match run {
                Ok((ck, last)) => (Ok(ck), last),
                Err(e) => (Err(e), None),
            };
            let code = report(rank, outcome, "");
            // The failed group is left as it is (its communicators are
            // aborted); the last group says goodbye.
            if let Some(last) = last {
                let t = Instant::now();
                last.shutdown()
                    .await
                    .map_err(|e| format!("shutdown: {e}"))?;
                println!("SHUTDOWN rank={rank} ms={}", t.elapsed().as_millis());
            }
            return Ok(code);
        }
        "matrix" => report(
            rank,
            matrix(&pg, &s).await,
            &format!(" comms={}", pg.nccl_comms_created()),
        ),
        "groups" => report(rank, groups(&pg, &s).await, ""),
        "busbw" => match busbw(&pg, &s).await {
            Ok(()) => 0,
            Err(e) => {
                println!("FAIL rank={rank} {e}");
                1
            }
        },
        other => {
            eprintln!(
                "unknown scenario '{other}' (matrix, seed, levels, checked, groups, busbw, kill, stop, rejoin)"
            );
            2
        }
    };
    let t = Instant::now();
    pg.shutdown().await.map_err(|e| format!("shutdown: {e}"))?;
    println!("SHUTDOWN rank={rank} ms={}", t.elapsed().as_millis());
    Ok(code)
}

fn main() -> std::process::ExitCode {
    let scenario = std::env::args().nth(1).unwrap_or_default();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start tokio: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let code = match rt.block_on(main_async(&scenario)) {
        Ok(code) => code,
        Err(e) => {
            println!(
                "ERROR rank={} {e}",
                std::env::var("RANK").unwrap_or_default()
            );
            4
        }
    };
    // Exit without running the runtime's or the communicators' destructors
    // a second time in a failed job.
    std::process::ExitCode::from(code as u8)
}
