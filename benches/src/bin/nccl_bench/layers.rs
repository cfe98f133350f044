//! `nccl_bench --layers`: where the host time of a device all_reduce goes.
//! The same small all_reduce on a 1-rank communicator, built up layer by
//! layer, each layer timed over `--iters` calls (median µs per call):
//!
//! * 1: a bare `ncclAllReduce` on a raw communicator;
//! * 2: the same with the input-ready record, the stream wait and the end
//!   record as raw driver calls: the floor of the two events per launch
//!   (docs/ARCHITECTURE.md, rule 3);
//! * 4: `Communicator::submit` (checks, event pool, lock, events, NCCL);
//! * 6: a work's bookkeeping alone, no GPU (registry entry, flight record,
//!   completion, drop);
//! * 7: `ProcessGroup::all_reduce` + `stream_ordered`, then the enqueue
//!   profile's phases (`CHORUS_NCCL_PROFILE=1`);
//! * 7b: `ProcessGroup::all_reduce` alone, each op awaited untimed.
//!
//! Layer 7 over layer 2 is what chorus adds to the driver's floor.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus::{DeviceBuffer, ReduceOp, StreamPriority};
use chorus_core::Op;
use chorus_gpu::cuda::Device;
use chorus_gpu::floor::RawComm;
use chorus_gpu::nccl::{CommOptions, Communicator, PendingComm};

use crate::Args;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Times `f` per call (median, µs); `sync` runs every 256 calls, untimed.
fn layer(name: &str, iters: usize, mut f: impl FnMut(), sync: impl FnMut()) -> f64 {
    layer_timed(
        name,
        iters,
        || {
            let t0 = Instant::now();
            f();
            t0.elapsed()
        },
        sync,
    )
}

/// Like [`layer`], but `f` returns the time of its timed part.
fn layer_timed(
    name: &str,
    iters: usize,
    mut f: impl FnMut() -> Duration,
    mut sync: impl FnMut(),
) -> f64 {
    let mut t = Vec::with_capacity(iters);
    for i in 0..iters {
        t.push(f().as_secs_f64() * 1e6);
        if i % 256 == 255 {
            sync();
        }
    }
    sync();
    let m = median(&mut t);
    println!("{name:<62} {m:7.2} us");
    m
}

/// A chorus communicator of one rank (non-blocking init, then polled).
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

/// Runs the layers on `args.device` and prints one line per layer.
pub(crate) fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let dev = Device::get(args.device)?;
    dev.bind_to_thread()?;
    let prod = dev.new_stream(StreamPriority::Normal)?;
    // Raw communicator with its own stream and buffer.
    let raw = RawComm::one_rank(&dev, 1, args.count)?;
    let cs = raw.stream();
    let raw_ar = || {
        raw.all_reduce(0).expect("ncclAllReduce");
    };
    let sync_all = || {
        cs.synchronize().expect("sync");
        prod.synchronize().expect("sync");
    };
    for _ in 0..2000 {
        raw_ar();
    }
    sync_all();
    println!(
        "nccl_bench --layers: {} x f32, {} calls per layer",
        args.count, args.iters
    );
    layer("1 ncclAllReduce", args.iters, raw_ar, sync_all);
    let ready = dev.new_event()?;
    let end = dev.new_event()?;
    layer(
        "2 + record/wait/record, raw driver calls",
        args.iters,
        || {
            raw.with_events(&prod, &ready, &end, |c| c.all_reduce(0))
                .and_then(|r| r)
                .expect("raw launch");
        },
        sync_all,
    );
    drop(raw);

    let c = communicator(&dev)?;
    let op = Op::AllReduce(ReduceOp::Sum);
    let mut held = Some(DeviceBuffer::new(
        prod.clone_htod(&vec![1f32; args.count])?,
    )?);
    layer_timed(
        "4 Communicator::submit (checks, pool, lock, events, NCCL)",
        args.iters,
        || {
            let b = held.take().expect("buffer");
            let t0 = Instant::now();
            let f = c.submit(op, b).map_err(|(e, _)| e).expect("submit");
            let dt = t0.elapsed();
            held = Some(f.wait().expect("wait").expect("buffer"));
            dt
        },
        || {},
    );
    drop(c);
    let reg = Arc::new(chorus_core::Registry::with_recorder(Arc::new(
        chorus_core::flight_recorder::FlightRecorder::new(1024),
    )));
    let group: Arc<str> = "layers".into();
    let mut seq = 0u64;
    layer(
        "6 Work::new_started + complete + drop (no GPU)",
        args.iters,
        || {
            seq += 1;
            chorus_benches::work_bookkeeping_round(&reg, &group, seq).expect("work");
        },
        || {},
    );

    let pg = chorus::test_util::one_rank_group("layers", args.device)?;
    let mut buf = Some(held.take().ok_or("buffer")?);
    for _ in 0..2000 {
        let b = buf.take().ok_or("buffer")?;
        buf = Some(futures::executor::block_on(
            pg.all_reduce(b, ReduceOp::Sum)?,
        )?);
    }
    chorus_core::profile::reset();
    layer(
        "7 ProcessGroup::all_reduce + stream_ordered",
        args.iters,
        || {
            let b = buf.take().expect("buffer");
            let w = pg.all_reduce(b, ReduceOp::Sum).expect("all_reduce");
            buf = Some(w.stream_ordered().expect("stream_ordered"));
        },
        || prod.synchronize().expect("sync"),
    );
    chorus_benches::print_profile();
    chorus_core::profile::reset();
    layer_timed(
        "7b ProcessGroup::all_reduce alone (then awaited, untimed)",
        args.iters,
        || {
            let b = buf.take().expect("buffer");
            let t0 = Instant::now();
            let w = pg.all_reduce(b, ReduceOp::Sum).expect("all_reduce");
            let dt = t0.elapsed();
            buf = Some(futures::executor::block_on(w).expect("await"));
            dt
        },
        || {},
    );
    chorus_benches::print_profile();
    prod.synchronize()?;
    Ok(())
}
