//! Sequential vs grouped all_reduces on one GPU: host submit time
//! and total time (submit until the GPU finished) for chorus and for raw
//! NCCL calls (`ncclAllReduce` in a loop, and inside `ncclGroupStart/End`),
//! at widths 1, 2, 4, 8, 16 of 1 MiB each, and chorus's coalesced
//! all_reduce (`all_reduce_coalesced`: the same NCCL group, one work). PyTorch's coalescing manager is
//! measured by `benches/compare/torch_coalesce.py` in the same call.
//!
//! A third pair of columns, "raw + events", is the floor of any library
//! that keeps two events per launch (docs/ARCHITECTURE.md, rule 3): the
//! same raw NCCL calls plus, per op (one by
//! one) or per group, an input-ready event recorded on a producer stream,
//! the communicator's stream waiting on it, and an end event recorded after
//! the op(s); the total waits on the end event. One by one it is given
//! twice: re-recording one end event after every op (which no per-op work
//! can use: only the last op's end is ever known), and with an end event
//! of its own per op ("raw+ev/op"), as per-op works need and chorus keeps.
//!
//! `group_bench [--iters N] [--count ELEMS] [--json PATH]`; needs a GPU.
#![forbid(unsafe_code)]

use std::time::Instant;

use chorus::{Device, DeviceBuffer, Event, ReduceOp, Stream, StreamPriority};
use chorus_benches::submit_each;
use chorus_gpu::floor::RawComm;
use clap::Parser;
use futures::executor::block_on;

#[derive(Parser, Debug)]
struct Args {
    /// Timed iterations per mode and width.
    #[arg(long, default_value_t = 300)]
    iters: usize,
    /// f32 elements per buffer (1 MiB by default).
    #[arg(long, default_value_t = 262_144)]
    count: usize,
    /// Widths (ops per iteration).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    widths: Vec<usize>,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<String>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Medians (µs) of submit time and total time over `iters` runs of `f`,
/// which returns (submit done, all done).
fn measure(iters: usize, mut f: impl FnMut() -> (Instant, Instant)) -> (f64, f64) {
    for _ in 0..iters / 5 + 10 {
        f();
    }
    let mut sub = Vec::with_capacity(iters);
    let mut tot = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        let (t1, t2) = f();
        sub.push((t1 - t0).as_secs_f64() * 1e6);
        tot.push((t2 - t0).as_secs_f64() * 1e6);
    }
    (median(&mut sub), median(&mut tot))
}

/// The raw floor: a raw NCCL communicator of one rank with its own stream
/// and buffers, a producer stream and the two events of a launch.
struct Raw {
    comm: RawComm,
    producer: Stream,
    ready: Event,
    end: Event,
    /// One end event per op, for the per-op floor.
    ends: Vec<Event>,
}

impl Raw {
    fn new(dev: &Device, width: usize, count: usize) -> Result<Raw, Box<dyn std::error::Error>> {
        Ok(Raw {
            comm: RawComm::one_rank(dev, width, count)?,
            producer: dev.new_stream(StreamPriority::Normal)?,
            ready: dev.new_event()?,
            end: dev.new_event()?,
            ends: (0..width)
                .map(|_| dev.new_event())
                .collect::<Result<_, _>>()?,
        })
    }

    /// Every buffer's all_reduce, one by one.
    fn each(c: &RawComm) {
        for i in 0..c.width() {
            if let Err(e) = c.all_reduce(i) {
                eprintln!("ncclAllReduce: {e}");
            }
        }
    }

    /// The raw calls alone, one by one or in one NCCL group; the total
    /// waits for the stream.
    fn run(&self, grouped: bool) -> (Instant, Instant) {
        let r = if grouped {
            self.comm.group(Self::each)
        } else {
            Self::each(&self.comm);
            Ok(())
        };
        if let Err(e) = r {
            eprintln!("group: {e}");
        }
        let t1 = Instant::now();
        let _ = self.comm.stream().synchronize();
        (t1, Instant::now())
    }

    /// The floor of the two events per launch: `run` plus the input-ready
    /// record and stream wait and the end record, per op (`grouped` false)
    /// or once around the group; the total waits on the end event. With
    /// `per_op`, each op records an end event of its own and the total
    /// waits on the last (the stream runs the ops in order).
    fn run_events(&self, grouped: bool, per_op: bool) -> (Instant, Instant) {
        let (p, ready) = (&self.producer, &self.ready);
        let end_of = |i: usize| match per_op {
            true => self.ends.get(i).unwrap_or(&self.end),
            false => &self.end,
        };
        let r = if grouped {
            self.comm
                .with_events(p, ready, &self.end, |c| c.group(Self::each))
                .and_then(|r| r)
        } else {
            (0..self.comm.width()).try_for_each(|i| {
                self.comm
                    .with_events(p, ready, end_of(i), |c| c.all_reduce(i))
                    .and_then(|r| r)
            })
        };
        if let Err(e) = r {
            eprintln!("events: {e}");
        }
        let t1 = Instant::now();
        let _ = end_of(self.comm.width().saturating_sub(1)).synchronize();
        (t1, Instant::now())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let dev = Device::get(0)?;
    let producer = dev.new_stream(StreamPriority::Normal)?;
    let pg = chorus_benches::one_rank_device_group("groupbench", 0)?;
    let maxw = args.widths.iter().copied().max().unwrap_or(1);
    let mut bufs: Vec<Option<DeviceBuffer<f32>>> = (0..maxw)
        .map(|_| -> Result<_, Box<dyn std::error::Error>> {
            Ok(Some(DeviceBuffer::new(
                producer.alloc_zeros::<f32>(args.count)?,
            )?))
        })
        .collect::<Result<_, _>>()?;
    producer.synchronize()?;
    println!(
        "{:>5} {:>22} {:>22} {:>22} {:>22} {:>22} {:>22} {:>22} {:>22}",
        "width",
        "chorus seq sub/tot",
        "chorus grp sub/tot",
        "chorus coal sub/tot",
        "raw seq sub/tot",
        "raw grp sub/tot",
        "raw+ev seq sub/tot",
        "raw+ev/op seq sub/tot",
        "raw+ev grp sub/tot"
    );
    let mut rows = Vec::new();
    for &w in &args.widths {
        // The works are kept in a vector made to size, as the raw loops
        // keep nothing.
        let seq = measure(args.iters, || {
            let works = submit_each(&mut bufs[..w], w, |b| pg.all_reduce(b, ReduceOp::Sum).ok());
            let t1 = Instant::now();
            for (slot, work) in bufs.iter_mut().zip(works) {
                *slot = block_on(work).ok();
            }
            (t1, Instant::now())
        });
        // The group's phases: staging (checks, sequence, batch), launch
        // (registration, the NCCL group, delivery), awaiting every work.
        let (mut stage_us, mut launch_us) = (Vec::new(), Vec::new());
        let grp = measure(args.iters, || {
            let t0 = Instant::now();
            let staged = {
                let mut g = pg.group();
                let ws = submit_each(&mut bufs[..w], w, |b| g.all_reduce(b, ReduceOp::Sum).ok());
                stage_us.push(t0.elapsed().as_secs_f64() * 1e6);
                let tl = Instant::now();
                let _ = g.launch();
                launch_us.push(tl.elapsed().as_secs_f64() * 1e6);
                ws
            };
            let t1 = Instant::now();
            for (slot, work) in bufs.iter_mut().zip(staged) {
                *slot = block_on(work).ok();
            }
            (t1, Instant::now())
        });
        let (stage, launch) = (median(&mut stage_us), median(&mut launch_us));
        let coal = measure(args.iters, || {
            let taken: Vec<_> = bufs[..w].iter_mut().filter_map(Option::take).collect();
            let work = match pg.all_reduce_coalesced(taken, ReduceOp::Sum) {
                Ok(work) => Some(work),
                Err(r) => {
                    for (slot, b) in bufs.iter_mut().zip(r.buffers) {
                        *slot = Some(b);
                    }
                    None
                }
            };
            let t1 = Instant::now();
            if let Some(Ok(out)) = work.map(block_on) {
                for (slot, b) in bufs.iter_mut().zip(out) {
                    *slot = Some(b);
                }
            }
            (t1, Instant::now())
        });
        if bufs.iter().any(Option::is_none) {
            return Err("an op failed during the benchmark".into());
        }
        let raw = Raw::new(&dev, w, args.count)?;
        let rseq = measure(args.iters, || raw.run(false));
        let rgrp = measure(args.iters, || raw.run(true));
        let eseq = measure(args.iters, || raw.run_events(false, false));
        let eop = measure(args.iters, || raw.run_events(false, true));
        let egrp = measure(args.iters, || raw.run_events(true, false));
        drop(raw);
        println!(
            "{w:>5} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1}",
            seq.0, seq.1, grp.0, grp.1, coal.0, coal.1, rseq.0, rseq.1, rgrp.0, rgrp.1, eseq.0, eseq.1, eop.0, eop.1, egrp.0, egrp.1
        );
        println!(
            "{w:>5} chorus grp phases: stage {stage:.1} / launch {launch:.1} / await {:.1} us",
            grp.1 - grp.0
        );
        rows.push(serde_json::json!({
            "width": w,
            "chorus_grouped_phases": {"stage_us": stage, "launch_us": launch, "await_us": grp.1 - grp.0},
            "chorus_seq": {"submit_us": seq.0, "total_us": seq.1},
            "chorus_grouped": {"submit_us": grp.0, "total_us": grp.1},
            "chorus_coalesced": {"submit_us": coal.0, "total_us": coal.1},
            "raw_seq": {"submit_us": rseq.0, "total_us": rseq.1},
            "raw_grouped": {"submit_us": rgrp.0, "total_us": rgrp.1},
            "raw_events_seq": {"submit_us": eseq.0, "total_us": eseq.1},
            "raw_events_per_op_seq": {"submit_us": eop.0, "total_us": eop.1},
            "raw_events_grouped": {"submit_us": egrp.0, "total_us": egrp.1},
        }));
    }
    if let Some(p) = args.json {
        let v = serde_json::json!({"count": args.count, "iters": args.iters, "rows": rows});
        std::fs::write(p, serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}
