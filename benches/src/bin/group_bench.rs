//! Sequential vs grouped all_reduces on one GPU (issue 7): host submit time
//! and total time (submit until the GPU finished) for chorus and for raw
//! NCCL calls (`ncclAllReduce` in a loop, and inside `ncclGroupStart/End`),
//! at widths 1, 2, 4, 8, 16 of 1 MiB each, and chorus's coalesced
//! all_reduce (`all_reduce_coalesced`: the same NCCL group, one work). PyTorch's coalescing manager is
//! measured by `benches/compare/torch_coalesce.py` in the same call.
//!
//! A third pair of columns, "raw + events", is the floor of any library that
//! follows DESIGN §2 rule 3: the same raw NCCL calls plus, per op (one by
//! one) or per group, an input-ready event recorded on a producer stream,
//! the communicator's stream waiting on it, and an end event recorded after
//! the op(s); the total waits on the end event.
//!
//! `group_bench [--iters N] [--count ELEMS] [--json PATH]`; needs a GPU.

use std::time::Instant;

use chorus::{DeviceBuffer, ReduceOp};
use chorus_gpu::cuda::{Device, Stream, StreamPriority};
use clap::Parser;
use futures::executor::block_on;
use nccl_sys::sys::{cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};

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

/// A raw NCCL communicator of one rank with its own stream and buffers.
struct Raw {
    nccl: &'static nccl_sys::Nccl,
    comm: ncclComm_t,
    stream: Stream,
    /// For the "raw + events" floor: a producer stream and the two events.
    producer: Stream,
    ready: chorus_gpu::cuda::Event,
    end: chorus_gpu::cuda::Event,
    ptrs: Vec<u64>,
    _bufs: Vec<chorus_gpu::cuda::CudaSlice<f32>>,
    count: usize,
}

impl Raw {
    fn new(dev: &Device, width: usize, count: usize) -> Result<Raw, Box<dyn std::error::Error>> {
        use cudarc::driver::DevicePtr;
        let nccl = nccl_sys::nccl()?;
        dev.bind_to_thread()?;
        let stream = dev.new_stream(StreamPriority::Normal)?;
        let mut id = ncclUniqueId::zeroed();
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `id` and `comm` are valid for writes; one rank of one.
        unsafe {
            nccl.check((nccl.ncclGetUniqueId)(&mut id))?;
            nccl.check((nccl.ncclCommInitRank)(&mut comm, 1, id, 0))?;
        }
        let mut bufs = Vec::new();
        let mut ptrs = Vec::new();
        for _ in 0..width {
            let b = stream.alloc_zeros::<f32>(count)?;
            let p = {
                let (p, _g) = b.device_ptr(stream.cudarc());
                p
            };
            ptrs.push(p);
            bufs.push(b);
        }
        stream.synchronize()?;
        Ok(Raw {
            nccl,
            comm,
            producer: dev.new_stream(StreamPriority::Normal)?,
            ready: dev.new_event()?,
            end: dev.new_event()?,
            stream,
            ptrs,
            _bufs: bufs,
            count,
        })
    }

    fn all_reduce(&self, p: u64) {
        let p = p as *mut std::ffi::c_void;
        // SAFETY: `p` is a live allocation of `count` f32 on this device
        // (kept in `_bufs`); the communicator and stream are live.
        let rc = unsafe {
            (self.nccl.ncclAllReduce)(
                p,
                p,
                self.count,
                ncclDataType_t::ncclFloat32,
                ncclRedOp_t::ncclSum,
                self.comm,
                self.stream.as_raw() as cudaStream_t,
            )
        };
        if let Err(e) = self.nccl.check(rc) {
            eprintln!("ncclAllReduce: {e}");
        }
    }

    fn run(&self, grouped: bool) -> (Instant, Instant) {
        if grouped {
            // SAFETY: paired with ncclGroupEnd below on this thread.
            let _ = unsafe { (self.nccl.ncclGroupStart)() };
        }
        for &p in &self.ptrs {
            self.all_reduce(p);
        }
        if grouped {
            // SAFETY: closes the group opened above.
            let _ = unsafe { (self.nccl.ncclGroupEnd)() };
        }
        let t1 = Instant::now();
        let _ = self.stream.synchronize();
        (t1, Instant::now())
    }

    /// The DESIGN §2 rule 3 floor: `run` plus the input-ready record and
    /// stream wait and the end record, per op (`grouped` false) or once
    /// around the group; the total waits on the end event.
    fn run_events(&self, grouped: bool) -> (Instant, Instant) {
        let events = |before: bool| {
            let r = if before {
                self.ready
                    .record(&self.producer)
                    .and_then(|()| self.stream.wait_event(&self.ready))
            } else {
                self.end.record(&self.stream)
            };
            if let Err(e) = r {
                eprintln!("event: {e}");
            }
        };
        if grouped {
            events(true);
            // SAFETY: paired with ncclGroupEnd below on this thread.
            let _ = unsafe { (self.nccl.ncclGroupStart)() };
            for &p in &self.ptrs {
                self.all_reduce(p);
            }
            // SAFETY: closes the group opened above.
            let _ = unsafe { (self.nccl.ncclGroupEnd)() };
            events(false);
        } else {
            for &p in &self.ptrs {
                events(true);
                self.all_reduce(p);
                events(false);
            }
        }
        let t1 = Instant::now();
        let _ = self.end.synchronize();
        (t1, Instant::now())
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.stream.synchronize();
        // SAFETY: the communicator is ours and idle.
        unsafe { (self.nccl.ncclCommDestroy)(self.comm) };
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
        "{:>5} {:>22} {:>22} {:>22} {:>22} {:>22} {:>22} {:>22}",
        "width",
        "chorus seq sub/tot",
        "chorus grp sub/tot",
        "chorus coal sub/tot",
        "raw seq sub/tot",
        "raw grp sub/tot",
        "raw+ev seq sub/tot",
        "raw+ev grp sub/tot"
    );
    let mut rows = Vec::new();
    for &w in &args.widths {
        let seq = measure(args.iters, || {
            let works: Vec<_> = bufs[..w]
                .iter_mut()
                .filter_map(Option::take)
                .filter_map(|b| pg.all_reduce(b, ReduceOp::Sum).ok())
                .collect();
            let t1 = Instant::now();
            for (slot, work) in bufs.iter_mut().zip(works) {
                *slot = block_on(work).ok();
            }
            (t1, Instant::now())
        });
        let grp = measure(args.iters, || {
            let staged = {
                let mut g = pg.group();
                let ws: Vec<_> = bufs[..w]
                    .iter_mut()
                    .filter_map(Option::take)
                    .filter_map(|b| g.all_reduce(b, ReduceOp::Sum).ok())
                    .collect();
                let _ = g.launch();
                ws
            };
            let t1 = Instant::now();
            for (slot, work) in bufs.iter_mut().zip(staged) {
                *slot = block_on(work).ok();
            }
            (t1, Instant::now())
        });
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
        let eseq = measure(args.iters, || raw.run_events(false));
        let egrp = measure(args.iters, || raw.run_events(true));
        drop(raw);
        println!(
            "{w:>5} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1} {:>10.1} / {:>9.1}",
            seq.0, seq.1, grp.0, grp.1, coal.0, coal.1, rseq.0, rseq.1, rgrp.0, rgrp.1, eseq.0, eseq.1, egrp.0, egrp.1
        );
        rows.push(serde_json::json!({
            "width": w,
            "chorus_seq": {"submit_us": seq.0, "total_us": seq.1},
            "chorus_grouped": {"submit_us": grp.0, "total_us": grp.1},
            "chorus_coalesced": {"submit_us": coal.0, "total_us": coal.1},
            "raw_seq": {"submit_us": rseq.0, "total_us": rseq.1},
            "raw_grouped": {"submit_us": rgrp.0, "total_us": rgrp.1},
            "raw_events_seq": {"submit_us": eseq.0, "total_us": eseq.1},
            "raw_events_grouped": {"submit_us": egrp.0, "total_us": egrp.1},
        }));
    }
    if let Some(p) = args.json {
        let v = serde_json::json!({"count": args.count, "iters": args.iters, "rows": rows});
        std::fs::write(p, serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}
