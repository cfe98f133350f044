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
//! `group_bench [--iters N] [--count ELEMS] [--widths W,..] [--interleave | --turns K] [--json PATH]`;
//! needs a GPU. With `--interleave` every iteration runs each mode once in
//! turn, so that drifts of the host's speed reach every mode alike (each
//! mode then starts with the others' code and data in the caches); with
//! `--turns K` each mode runs K iterations in a row, the modes in turn, so
//! that each turn but its first iteration finds its own code and data
//! warm while the host's slow stretches, which last milliseconds, still
//! reach every mode alike.
//!
//! `--layers [L,..]` times instead where a group's host time goes, layer
//! by layer from the raw floor to `ProcessGroup::batch` (`layers`).
#![forbid(unsafe_code)]

mod layers;

use std::time::Instant;

use chorus::{Device, DeviceBuffer, Event, ReduceOp, Stream, StreamPriority};
use chorus_benches::submit_each;
use chorus_gpu::floor::RawComm;
use clap::Parser;
use futures::executor::block_on;

#[derive(Parser, Debug)]
pub(crate) struct Args {
    /// Timed iterations per mode and width (with `--layers`: groups per
    /// layer).
    #[arg(long, default_value_t = 300)]
    pub(crate) iters: usize,
    /// f32 elements per buffer (1 MiB by default).
    #[arg(long, default_value_t = 262_144)]
    pub(crate) count: usize,
    /// Widths (ops per iteration); `--layers` runs at the widest.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    pub(crate) widths: Vec<usize>,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<String>,
    /// Run the modes in turn within each iteration instead of each in a
    /// block of its own (a fairer comparison on a host whose speed drifts).
    #[arg(long, conflicts_with = "turns")]
    interleave: bool,
    /// Run the modes in turns of this many iterations each (1 is
    /// `--interleave`), instead of each in a block of its own.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    turns: Option<u32>,
    /// Instead, time a group layer by layer (`g1,s1,s1e,g2,g3b,s2,s3,g4,s4`;
    /// all when no list is given): the raw floor, chorus-gpu's batch, the
    /// works' registration, `ProcessGroup`.
    #[arg(long, value_delimiter = ',', num_args = 0.., conflicts_with_all = ["json", "interleave", "turns"])]
    layers: Option<Vec<String>>,
}

/// How the modes' iterations are ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    /// Each mode's iterations in one block.
    Blocks,
    /// The modes in turn, this many iterations of each per turn.
    Turns(usize),
}

impl Order {
    fn of(args: &Args) -> Order {
        match (args.interleave, args.turns) {
            (true, _) => Order::Turns(1),
            (false, Some(k)) => Order::Turns(k as usize),
            (false, None) => Order::Blocks,
        }
    }

    /// As the JSON output names it.
    fn label(self) -> String {
        match self {
            Order::Blocks => "blocks".into(),
            Order::Turns(1) => "interleaved".into(),
            Order::Turns(k) => format!("turns of {k}"),
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
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

/// What one iteration runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    ChorusSeq,
    ChorusGroup,
    ChorusCoalesced,
    RawSeq,
    RawGroup,
    EventsSeq,
    EventsPerOp,
    EventsGroup,
}

const MODES: [Mode; 8] = [
    Mode::ChorusSeq,
    Mode::ChorusGroup,
    Mode::ChorusCoalesced,
    Mode::RawSeq,
    Mode::RawGroup,
    Mode::EventsSeq,
    Mode::EventsPerOp,
    Mode::EventsGroup,
];

/// What the modes of one width run on.
struct Bench<'a> {
    pg: &'a chorus::ProcessGroup,
    bufs: &'a mut [Option<DeviceBuffer<f32>>],
    raw: &'a Raw,
    /// A group's staging and launch times (µs), one per group run.
    stage_us: Vec<f64>,
    launch_us: Vec<f64>,
}

impl Bench<'_> {
    /// Runs `mode` once; returns when its submission ended and when the
    /// GPU was known to have finished.
    fn run(&mut self, mode: Mode) -> (Instant, Instant) {
        let w = self.raw.comm.width();
        match mode {
            Mode::ChorusSeq => {
                let pg = self.pg;
                let works = submit_each(&mut self.bufs[..w], w, |b| {
                    pg.all_reduce(b, ReduceOp::Sum).ok()
                });
                let t1 = Instant::now();
                for (slot, work) in self.bufs.iter_mut().zip(works) {
                    *slot = block_on(work).ok();
                }
                (t1, Instant::now())
            }
            // The group's phases: staging (checks, sequence, batch), launch
            // (registration, the NCCL group, delivery), awaiting every work.
            Mode::ChorusGroup => {
                let t0 = Instant::now();
                let staged = {
                    let mut g = self.pg.batch();
                    let ws = submit_each(&mut self.bufs[..w], w, |b| {
                        g.all_reduce(b, ReduceOp::Sum).ok()
                    });
                    self.stage_us.push(t0.elapsed().as_secs_f64() * 1e6);
                    let tl = Instant::now();
                    let _ = g.launch();
                    self.launch_us.push(tl.elapsed().as_secs_f64() * 1e6);
                    ws
                };
                let t1 = Instant::now();
                for (slot, work) in self.bufs.iter_mut().zip(staged) {
                    *slot = block_on(work).ok();
                }
                (t1, Instant::now())
            }
            Mode::ChorusCoalesced => {
                let taken: Vec<_> = self.bufs[..w].iter_mut().filter_map(Option::take).collect();
                let work = match self.pg.all_reduce_coalesced(taken, ReduceOp::Sum) {
                    Ok(work) => Some(work),
                    Err(r) => {
                        for (slot, b) in self.bufs.iter_mut().zip(r.buffers) {
                            *slot = Some(b);
                        }
                        None
                    }
                };
                let t1 = Instant::now();
                if let Some(Ok(out)) = work.map(block_on) {
                    for (slot, b) in self.bufs.iter_mut().zip(out) {
                        *slot = Some(b);
                    }
                }
                (t1, Instant::now())
            }
            Mode::RawSeq => self.raw.run(false),
            Mode::RawGroup => self.raw.run(true),
            Mode::EventsSeq => self.raw.run_events(false, false),
            Mode::EventsPerOp => self.raw.run_events(false, true),
            Mode::EventsGroup => self.raw.run_events(true, false),
        }
    }

    /// Medians (µs) of submit and total time of each mode over `iters`
    /// runs (after a warm-up of a fifth): each mode in a block of its own,
    /// or the modes in turns of a few iterations each, so that each mode's
    /// samples see the host as the others' do.
    fn measure(&mut self, iters: usize, order: Order) -> Vec<(f64, f64)> {
        let mut sub = vec![Vec::with_capacity(iters); MODES.len()];
        let mut tot = vec![Vec::with_capacity(iters); MODES.len()];
        let warm = iters / 5 + 10;
        let mut once = |b: &mut Self, i: usize, keep: bool| {
            let t0 = Instant::now();
            let (t1, t2) = b.run(MODES[i]);
            if keep {
                sub[i].push((t1 - t0).as_secs_f64() * 1e6);
                tot[i].push((t2 - t0).as_secs_f64() * 1e6);
            }
        };
        let total = warm + iters;
        // A block is a single turn as long as the whole run.
        let k = match order {
            Order::Turns(k) => k.max(1),
            Order::Blocks => total,
        };
        let mut n = 0;
        while n < total {
            let turn = k.min(total - n);
            for i in 0..MODES.len() {
                for j in n..n + turn {
                    once(self, i, j >= warm);
                }
            }
            n += turn;
        }
        // Nor are the warm-up's phases: only the last `iters` groups'.
        for v in [&mut self.stage_us, &mut self.launch_us] {
            v.drain(..v.len().saturating_sub(iters));
        }
        sub.iter_mut()
            .zip(tot.iter_mut())
            .map(|(s, t)| (median(s), median(t)))
            .collect()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if let Some(layers) = &args.layers {
        return layers::run(&args, layers);
    }
    let order = Order::of(&args);
    let dev = Device::get(0)?;
    let producer = dev.new_stream(StreamPriority::Normal)?;
    let pg = chorus::test_util::one_rank_group("groupbench", 0)?;
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
        let raw = Raw::new(&dev, w, args.count)?;
        let mut bench = Bench {
            pg: &pg,
            bufs: &mut bufs[..w],
            raw: &raw,
            stage_us: Vec::new(),
            launch_us: Vec::new(),
        };
        let m = bench.measure(args.iters, order);
        let (stage, launch) = (median(&mut bench.stage_us), median(&mut bench.launch_us));
        if bufs.iter().any(Option::is_none) {
            return Err("an op failed during the benchmark".into());
        }
        drop(raw);
        let [seq, grp, coal, rseq, rgrp, eseq, eop, egrp] = [0, 1, 2, 3, 4, 5, 6, 7].map(|i| m[i]);
        println!(
            "{w:>5} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1}",
            seq.0, seq.1, grp.0, grp.1, coal.0, coal.1, rseq.0, rseq.1, rgrp.0, rgrp.1, eseq.0, eseq.1, eop.0, eop.1, egrp.0, egrp.1
        );
        println!(
            "{w:>5} chorus grp phases: stage {stage:.1} / launch {launch:.1} / await {:.1} us",
            grp.1 - grp.0
        );
        println!(
            "{w:>5} ratios: a group / raw+ev grp {:.2}x, one by one / raw+ev/op {:.2}x, coalesced / raw+ev grp {:.2}x",
            grp.1 / egrp.1,
            seq.1 / eop.1,
            coal.1 / egrp.1
        );
        rows.push(serde_json::json!({
            "width": w,
            "order": order.label(),
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
