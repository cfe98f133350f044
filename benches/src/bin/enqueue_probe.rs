//! Where the host time of a device all_reduce goes: the same small
//! all_reduce on a 1-rank communicator, built up layer by layer, each layer
//! timed over many calls (median). One GPU; no NCCL, no GPU: an error.
//!
//! ```text
//! enqueue_probe [--iters N] [--count C]
//! ```
//!
//! Layers: (1) a bare `ncclAllReduce`; (2) + input-ready record, stream wait
//! and end record as raw driver calls (the floor of the two events per
//! launch, docs/ARCHITECTURE.md rule 3);
//! (3) the same through chorus's `Event`/`Stream` wrappers; (4)
//! `Communicator::submit` (checks, event pool, lock); (5) + hand-off to the
//! completion reactor and a stream-ordered take; (6) `Work::new_started`
//! alone (registry, flight recorder, completion); (7) the full
//! `ProcessGroup::all_reduce` + `stream_ordered`.
//!
//! And what might move the floor: (2o) after a stream-ordered take of the
//! previous op, (2e) end events rotating through a pool, (2a, 2b) a work's
//! bookkeeping run between ops, (2d, 1d) pauses that let the GPU keep up,
//! (2q, 2p, 2s) another thread querying the end event at three rates; and
//! (8, 8x) work + submit with the completions batched on this thread or on
//! another one.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus::{Device, DeviceBuffer, ReduceOp, StreamPriority};
use chorus_core::Op;
use chorus_gpu::floor::RawComm;
use chorus_gpu::nccl::{CommOptions, Communicator, PendingComm};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Layer-by-layer host cost of a device all_reduce (1 rank, device 0)")]
struct Args {
    /// Calls per layer.
    #[arg(long, default_value_t = 50000)]
    iters: usize,
    /// Elements (f32).
    #[arg(long, default_value_t = 256)]
    count: usize,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
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
    println!("{name:<58} {m:6.3} us");
    m
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let dev = Device::get(0)?;
    dev.bind_to_thread()?;
    let prod = dev.new_stream(StreamPriority::Normal)?;
    // Raw communicator with its own stream and buffer.
    let raw = RawComm::one_rank(&dev, 1, args.count)?;
    let cs = raw.stream();
    let count = args.count;
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
        "enqueue_probe: {} x f32, {} calls per layer",
        count, args.iters
    );
    layer("1 ncclAllReduce", args.iters, raw_ar, sync_all);
    let ready = dev.new_event()?;
    let end = dev.new_event()?;
    // The floor of the two events per launch as raw driver calls:
    // input-ready record on
    // the producer stream, the comm stream waits on it, the op, the end
    // record (on `endv`).
    let rule3 = |endv: &chorus::Event| {
        raw.with_events(&prod, &ready, endv, |c| c.all_reduce(0))
            .and_then(|r| r)
            .expect("raw launch");
    };
    layer(
        "2 + record/wait/record, raw driver calls",
        args.iters,
        || {
            rule3(&end);
        },
        sync_all,
    );
    layer(
        "3 + the same through chorus Event/Stream (cudarc)",
        args.iters,
        || {
            ready.record(&prod).expect("record");
            cs.wait_event(&ready).expect("wait");
            raw_ar();
            end.record(cs).expect("record");
        },
        sync_all,
    );
    layer(
        "3b record/wait/record alone, chorus wrappers",
        args.iters,
        || {
            ready.record(&prod).expect("record");
            cs.wait_event(&ready).expect("wait");
            end.record(cs).expect("record");
        },
        sync_all,
    );
    // The floor in the pattern nccl_bench times: each op's buffer comes
    // back stream-ordered (the producer stream waits on the end event), so
    // the next input-ready record follows a wait on the previous op.
    layer_timed(
        "2o layer 2 after a stream-ordered take of the previous op",
        args.iters,
        || {
            let t0 = Instant::now();
            rule3(&end);
            let dt = t0.elapsed();
            // The stream-ordered take, untimed.
            prod.wait_event_bound(&end).expect("wait");
            dt
        },
        sync_all,
    );
    // What else might make the same four calls dearer inside chorus: end
    // events rotating through a pool (2e), the op's host bookkeeping run
    // between the calls (2a, untimed), or both with a stream-ordered take.
    let pool_ev: Vec<_> = (0..32).map(|_| dev.new_event().expect("event")).collect();
    let mut k = 0usize;
    layer(
        "2e layer 2, end events rotating through 32",
        args.iters,
        || {
            k = (k + 1) % pool_ev.len();
            rule3(&pool_ev[k]);
        },
        sync_all,
    );
    let breg = Arc::new(chorus_core::Registry::with_recorder(Arc::new(
        chorus_core::flight_recorder::FlightRecorder::new(1024),
    )));
    let bgroup: Arc<str> = "probe-b".into();
    let mut bseq = 0u64;
    for (name, rotate, take) in [
        (
            "2a layer 2 + a work's bookkeeping between ops (untimed)",
            false,
            false,
        ),
        (
            "2b 2a + end events rotating + stream-ordered take",
            true,
            true,
        ),
    ] {
        layer_timed(
            name,
            args.iters,
            || {
                bseq += 1;
                chorus_benches::work_bookkeeping_round(&breg, &bgroup, bseq).expect("work");
                k = (k + 1) % pool_ev.len();
                let endv = if rotate { &pool_ev[k] } else { &end };
                let t0 = Instant::now();
                rule3(endv);
                let dt = t0.elapsed();
                if take {
                    prod.wait_event_bound(endv).expect("wait");
                }
                dt
            },
            sync_all,
        );
    }
    // The same calls when the GPU keeps up: a host pause between ops
    // (untimed) lets it drain the streams, so each op meets idle streams.
    for pause_us in [2u64, 5, 20] {
        layer_timed(
            &format!("2d layer 2 with {pause_us} us between ops (GPU keeps up)"),
            args.iters / 2,
            || {
                let p0 = Instant::now();
                while p0.elapsed() < Duration::from_micros(pause_us) {
                    std::hint::spin_loop();
                }
                let t0 = Instant::now();
                rule3(&end);
                t0.elapsed()
            },
            sync_all,
        );
    }
    layer_timed(
        "1d bare ncclAllReduce with 20 us between ops",
        args.iters / 2,
        || {
            let p0 = Instant::now();
            while p0.elapsed() < Duration::from_micros(20) {
                std::hint::spin_loop();
            }
            let t0 = Instant::now();
            raw_ar();
            t0.elapsed()
        },
        sync_all,
    );
    // The same floor while another thread queries an end event, as the
    // completion reactor does while ops are in flight: does the driver make
    // the enqueuing thread pay for it?
    for (name, pause) in [
        (
            "2q layer 2 + a thread querying the end event flat out",
            0u32,
        ),
        ("2p layer 2 + a thread querying it, 256 spins between", 256),
        (
            "2s layer 2 + a thread querying it, 4096 spins between",
            4096,
        ),
    ] {
        let stop = std::sync::atomic::AtomicBool::new(false);
        let queries = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|sc| {
            sc.spawn(|| {
                dev.bind_to_thread().expect("bind");
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::black_box(end.query().ok());
                    queries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    for _ in 0..pause {
                        std::hint::spin_loop();
                    }
                }
            });
            let t = Instant::now();
            layer(
                name,
                args.iters,
                || {
                    rule3(&end);
                },
                sync_all,
            );
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let q = queries.load(std::sync::atomic::Ordering::Relaxed) as f64;
            println!(
                "   (querier: {:.2} queries/us)",
                q / t.elapsed().as_secs_f64() / 1e6
            );
        });
    }
    layer(
        "3c Instant::now",
        args.iters,
        || {
            std::hint::black_box(Instant::now());
        },
        || {},
    );

    // A chorus communicator (non-blocking init, then polled).
    let mut pending = PendingComm::init(
        &dev,
        1,
        0,
        &chorus_gpu::nccl::unique_id()?,
        CommOptions::default(),
    )?;
    let t0 = Instant::now();
    let c: Communicator = loop {
        if let Some(r) = pending.poll()? {
            break r.ok_or("no communicator")?;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            return Err("communicator init timed out".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let ccs = c.stream().clone();
    let op = Op::AllReduce(ReduceOp::Sum);
    let buf = DeviceBuffer::new(prod.clone_htod(&vec![1f32; args.count])?)?;
    let mut held = Some(buf);
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
    let (btx, brx) = std::sync::mpsc::channel();
    layer(
        "5 + reactor hand-off (watch) and stream-ordered take",
        args.iters,
        || {
            let b = held.take().expect("buffer");
            let f = c.submit(op, b).map_err(|(e, _)| e).expect("submit");
            let tx = btx.clone();
            let w = f.watch(move |(_, bufs)| {
                if let Some(b) = bufs {
                    let _ = tx.send(b);
                }
            });
            held = Some(match w.take_stream_ordered(None).expect("take") {
                Some(b) => b,
                // Finished already: the callback has the buffer.
                None => brx.recv().expect("buffer"),
            });
        },
        || {
            ccs.synchronize().expect("sync");
            prod.synchronize().expect("sync");
        },
    );
    let reg = Arc::new(chorus_core::Registry::with_recorder(Arc::new(
        chorus_core::flight_recorder::FlightRecorder::new(1024),
    )));
    let group: Arc<str> = "probe".into();
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
    // What a deferred hand-off would cost: the work is registered and the
    // op submitted, nothing goes to another thread at enqueue; the finished
    // ops' bookkeeping is completed in batches, (8) on this thread, (8x) by
    // another thread every 16 ops. Buffers rotate through a pool.
    type Done = (
        chorus_gpu::nccl::InFlight<DeviceBuffer<f32>>,
        chorus_core::Completer<u32>,
        chorus_core::OpFuture<u32>,
    );
    let mut pool: Vec<DeviceBuffer<f32>> = (0..64)
        .map(|_| {
            DeviceBuffer::new(prod.clone_htod(&vec![1f32; args.count]).expect("alloc"))
                .expect("buf")
        })
        .collect();
    for cross in [false, true] {
        let (dtx, drx) = std::sync::mpsc::channel::<Vec<Done>>();
        let (rtx, rrx) = std::sync::mpsc::channel::<Vec<DeviceBuffer<f32>>>();
        let worker = cross.then(|| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                dev.bind_to_thread().expect("bind");
                for batch in drx {
                    let mut back = Vec::new();
                    for (f, done, w) in batch {
                        back.extend(f.wait().expect("wait"));
                        done.complete(Ok(1));
                        drop(w);
                    }
                    if rtx.send(back).is_err() {
                        break;
                    }
                }
            })
        });
        let mut batch: Vec<Done> = Vec::new();
        let mut sent = 0usize;
        let name = if cross {
            "8x work + submit, completed by another thread every 16 ops"
        } else {
            "8 work + submit, completed in batches on this thread"
        };
        layer_timed(
            name,
            args.iters,
            || {
                if pool.is_empty() {
                    // Take back what the completer thread released.
                    while sent > 0 {
                        pool.extend(rrx.recv().expect("buffers"));
                        sent -= 1;
                    }
                }
                let b = pool.pop().expect("buffer");
                seq += 1;
                let t0 = Instant::now();
                let (w, done) = chorus_benches::started_work(&reg, &group, seq, t0).expect("work");
                let f = c.submit(op, b).map_err(|(e, _)| e).expect("submit");
                let dt = t0.elapsed();
                batch.push((f, done, w));
                if batch.len() == 16 {
                    let full = std::mem::take(&mut batch);
                    if cross {
                        dtx.send(full).expect("send");
                        sent += 1;
                    } else {
                        for (f, done, w) in full {
                            pool.extend(f.wait().expect("wait"));
                            done.complete(Ok(1));
                            drop(w);
                        }
                    }
                }
                dt
            },
            || {},
        );
        for (f, done, w) in batch.drain(..) {
            pool.extend(f.wait().expect("wait"));
            done.complete(Ok(1));
            drop(w);
        }
        drop(dtx);
        while sent > 0 {
            pool.extend(rrx.recv().expect("buffers"));
            sent -= 1;
        }
        if let Some(h) = worker {
            h.join().expect("worker");
        }
    }
    drop(pool);
    drop(c);

    let pg = chorus_benches::one_rank_device_group("probe", 0)?;
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
