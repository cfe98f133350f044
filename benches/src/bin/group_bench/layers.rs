//! `group_bench --layers`: where the host time of a group of per-op
//! works goes. The widest of `--widths` all_reduces of `--count` f32 on a
//! 1-rank communicator, issued and awaited, built up layer by layer
//! (median total µs per group over `--iters` groups, submit until the host
//! knows the GPU finished; the GPU's part is the same in every layer, so
//! differences between layers are host costs).
//!
//! Batched: (g1) the raw NCCL group with one input-ready wait and one end
//! event, the floor of docs/ARCHITECTURE.md rule 3; (g2) chorus-gpu's
//! `Batch`: pushes, launch, each op's buffers taken back once the shared
//! end event completed; (g3b) g2 plus the ops' works registered as one
//! batch (`chorus_core::WorkBatch`); (g4) `ProcessGroup::batch`, each
//! work awaited with `block_on`.
//!
//! One by one: (s1) raw calls with the two events per op, one end event
//! re-recorded; (s1e) the same with an end event per op; (s2)
//! `Communicator::submit` per op, each op's buffer taken back once its end
//! event completed; (s3) s2 plus a registered work per op; (s4)
//! `ProcessGroup::all_reduce` per op, each work awaited, then again with
//! the enqueue profile (`CHORUS_NCCL_PROFILE=1`).
//!
//! `--layers g1,g4` times only those (e.g. one layer under a profiler).

use std::time::{Duration, Instant};

use chorus::{DeviceBuffer, ReduceOp, StreamPriority};
use chorus_benches::submit_each;
use chorus_core::Op;
use chorus_gpu::cuda::Device;
use chorus_gpu::floor::RawComm;
use chorus_gpu::nccl::{CommOptions, Communicator, InFlight, PendingComm};
use futures::executor::block_on;

use crate::Args;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Times `f` (one whole group) `iters` times after a warm-up; prints and
/// returns the median in µs. A layer left out of `--layers` is skipped.
fn layer(only: &[String], name: &str, iters: usize, mut f: impl FnMut()) -> f64 {
    let id = name.split_whitespace().next().unwrap_or("");
    if !only.is_empty() && !only.iter().any(|l| l == id) {
        return f64::NAN;
    }
    for _ in 0..iters / 10 + 20 {
        f();
    }
    let mut t: Vec<f64> = (0..iters)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    let m = median(&mut t);
    println!("{name:<62} {m:7.2} us");
    m
}

/// Spins on the op's end event until its buffers come back.
fn finished(mut f: InFlight<DeviceBuffer<f32>>) -> DeviceBuffer<f32> {
    loop {
        match f.take_finished() {
            Ok(Some(b)) => return b,
            Ok(None) => std::hint::spin_loop(),
            Err(e) => panic!("op failed: {e}"),
        }
    }
}

fn communicator(dev: &Device) -> Result<Communicator, Box<dyn std::error::Error>> {
    let id = chorus_gpu::nccl::unique_id()?;
    let mut pending = PendingComm::init(dev, 1, 0, &id, CommOptions::default())?;
    let t0 = Instant::now();
    loop {
        if let Some(r) = pending.poll()? {
            return Ok(r.ok_or("no communicator")?);
        }
        if t0.elapsed() > Duration::from_secs(60) {
            return Err("communicator init timed out".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Runs the layers named in `layers` (all when empty) at the widest of
/// `args.widths`; prints one line per layer.
pub(crate) fn run(args: &Args, layers: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let w = args.widths.iter().copied().max().unwrap_or(16);
    let iters = args.iters;
    let dev = Device::get(0)?;
    dev.bind_to_thread()?;
    let prod = dev.new_stream(StreamPriority::Normal)?;
    let mut bufs: Vec<DeviceBuffer<f32>> = (0..w)
        .map(|_| Ok(DeviceBuffer::new(prod.alloc_zeros::<f32>(args.count)?)?))
        .collect::<Result<_, Box<dyn std::error::Error>>>()?;
    prod.synchronize()?;
    println!(
        "group_bench --layers: {w} ops of {} f32 per group, {iters} groups per layer",
        args.count
    );

    let raw = RawComm::one_rank(&dev, w, args.count)?;
    let (ready, end) = (dev.new_event()?, dev.new_event()?);
    let each = |c: &RawComm| {
        for i in 0..c.width() {
            c.all_reduce(i).expect("ncclAllReduce");
        }
    };
    layer(
        layers,
        "g1 raw NCCL group + one input-ready wait + one end event",
        iters,
        || {
            raw.with_events(&prod, &ready, &end, |c| c.group(each))
                .and_then(|r| r)
                .expect("raw group");
            end.synchronize().expect("sync");
        },
    );
    layer(
        layers,
        "s1 raw calls one by one, two events per op",
        iters,
        || {
            for i in 0..w {
                raw.with_events(&prod, &ready, &end, |c| c.all_reduce(i))
                    .and_then(|r| r)
                    .expect("raw op");
            }
            end.synchronize().expect("sync");
        },
    );
    // As s1, with an end event of its own per op (what per-op works need:
    // with one event re-recorded, only the last op's end can be known).
    let ends: Vec<_> = (0..w).map(|_| dev.new_event()).collect::<Result<_, _>>()?;
    layer(
        layers,
        "s1e raw calls one by one, an end event per op",
        iters,
        || {
            for (i, end) in ends.iter().enumerate() {
                raw.with_events(&prod, &ready, end, |c| c.all_reduce(i))
                    .and_then(|r| r)
                    .expect("raw op");
            }
            if let Some(last) = ends.last() {
                last.synchronize().expect("sync");
            }
        },
    );
    drop(raw);

    let c = std::sync::Arc::new(communicator(&dev)?);
    let op = Op::AllReduce(ReduceOp::Sum);
    let reg = std::sync::Arc::new(chorus_core::Registry::with_recorder(std::sync::Arc::new(
        chorus_core::flight_recorder::FlightRecorder::new(1024),
    )));
    let group: std::sync::Arc<str> = "layers".into();
    let mut seq = 0u64;
    // g3b registers the ops' works as one batch (one registry entry).
    for batched in [false, true] {
        let name = if batched {
            "g3b g2 + the ops' works registered as one batch"
        } else {
            "g2 chorus-gpu Batch: push, launch, take, buffers back"
        };
        layer(layers, name, iters, || {
            let mut batch = c.batch();
            let tickets: Vec<_> = bufs
                .drain(..)
                .map(|b| batch.push(op, b).map_err(|(e, _)| e).expect("push"))
                .collect();
            let works: Vec<_> = if batched {
                let first = seq + 1;
                chorus_benches::started_batch(&reg, &group, first, w, Instant::now())
                    .expect("works")
                    .into_iter()
                    .inspect(|_| seq += 1)
                    .collect()
            } else {
                Vec::new()
            };
            let mut launched = batch.launch();
            let flights: Vec<_> = tickets
                .into_iter()
                .map(|t| launched.take(t).expect("take"))
                .collect();
            drop(launched);
            let mut works = works.into_iter();
            for f in flights {
                bufs.push(finished(f));
                if let Some((work, done)) = works.next() {
                    done.complete(Ok(1));
                    drop(work);
                }
            }
        });
    }
    for with_works in [false, true] {
        let name = if with_works {
            "s3 s2 + a registered work per op"
        } else {
            "s2 Communicator::submit per op, buffers back"
        };
        layer(layers, name, iters, || {
            let flights: Vec<_> = bufs
                .drain(..)
                .map(|b| {
                    let work = with_works.then(|| {
                        seq += 1;
                        chorus_benches::started_work(&reg, &group, seq, Instant::now())
                            .expect("work")
                    });
                    (c.submit(op, b).map_err(|(e, _)| e).expect("submit"), work)
                })
                .collect();
            for (f, work) in flights {
                bufs.push(finished(f));
                if let Some((work, done)) = work {
                    done.complete(Ok(1));
                    drop(work);
                }
            }
        });
    }
    drop(c);

    let pg = chorus::test_util::one_rank_group("group_layers", 0)?;
    let mut slots: Vec<Option<DeviceBuffer<f32>>> = bufs.drain(..).map(Some).collect();
    layer(
        layers,
        "g4 ProcessGroup::batch: stage, launch, await each",
        iters,
        || {
            let works = {
                let mut g = pg.batch();
                let ws = submit_each(&mut slots, w, |b| {
                    Some(g.all_reduce(b, ReduceOp::Sum).expect("stage"))
                });
                g.launch().expect("launch");
                ws
            };
            for (slot, work) in slots.iter_mut().zip(works) {
                *slot = Some(block_on(work).expect("await"));
            }
        },
    );
    let mut one_by_one = || {
        let works = submit_each(&mut slots, w, |b| {
            Some(pg.all_reduce(b, ReduceOp::Sum).expect("all_reduce"))
        });
        for (slot, work) in slots.iter_mut().zip(works) {
            *slot = Some(block_on(work).expect("await"));
        }
    };
    layer(
        layers,
        "s4 ProcessGroup::all_reduce per op, await each",
        iters,
        &mut one_by_one,
    );
    chorus_core::profile::reset();
    layer(
        layers,
        "s4 again, with the enqueue profile",
        iters / 4,
        &mut one_by_one,
    );
    chorus_benches::print_profile();
    prod.synchronize()?;
    Ok(())
}
