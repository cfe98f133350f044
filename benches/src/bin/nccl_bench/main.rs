//! Host-side costs of the NCCL backend on one GPU (a 1-rank group), to put
//! beside PyTorch's ProcessGroupNCCL (`benches/compare/torch_nccl.py`, same
//! machine, same call):
//!
//! * enqueue: host time of one `all_reduce` call on a small device buffer;
//! * stream-ordered wait: host time of `DeviceWork::stream_ordered`;
//! * wake latency: end event complete (seen by a thread spinning on
//!   `cuEventQuery`) → the awaiting future's waker called, and → the awaiting
//!   thread running again, after a spin kernel of a given length;
//! * round trips per second of `block_on(all_reduce(..))` (GPU finished each
//!   time).
//!
//! `--enqueue-only` runs the enqueue / stream-ordered loop alone (for a
//! profiler, or an A/B of two builds); `--layers` the enqueue built up
//! layer by layer from a bare `ncclAllReduce` (`layers`).
//!
//! Needs a CUDA GPU and NCCL. `nccl_bench --help` for the knobs.
#![forbid(unsafe_code)]

mod layers;

use std::future::Future;
use std::path::PathBuf;
use std::pin::pin;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use chorus::{DeviceBuffer, ReduceOp};
use chorus_core::sync::lock;
use chorus_gpu::cuda::kernels::Kernels;
use chorus_gpu::cuda::{Device, StreamPriority};
use chorus_gpu::nccl::EndEvent;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "NCCL backend host-cost benchmark (1-rank group on device 0)")]
pub(crate) struct Args {
    /// Iterations of the enqueue / stream-ordered loop (with `--layers`:
    /// calls per layer).
    #[arg(long, default_value_t = 20000)]
    pub(crate) iters: usize,
    /// Elements (f32) of the small message.
    #[arg(long, default_value_t = 256)]
    pub(crate) count: usize,
    /// Wake-latency samples per spin length.
    #[arg(long, default_value_t = 400)]
    wake_iters: usize,
    /// Spin-kernel lengths for the wake latency, in microseconds.
    #[arg(long, value_delimiter = ',', default_value = "100,3000")]
    spin_us: Vec<u64>,
    /// Seconds of the round-trip loop.
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// CUDA device.
    #[arg(long, default_value_t = 0)]
    pub(crate) device: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The enqueue loop synchronizes the producer stream every this many
    /// ops (the GPU's backlog is at most this long).
    #[arg(long, default_value_t = 256)]
    sync_every: usize,
    /// Host pause between ops of the enqueue loop, untimed, in
    /// microseconds (0: back to back, the GPU falls behind; a few: the GPU
    /// keeps up, as when a trainer computes between collectives).
    #[arg(long, default_value_t = 0.0)]
    pause_us: f64,
    /// Run only the enqueue / stream-ordered loop and print its figures
    /// (for profiling the enqueue path, e.g. under `perf record`).
    #[arg(long)]
    enqueue_only: bool,
    /// Instead, time the enqueue layer by layer: a bare `ncclAllReduce`,
    /// the driver's floor of the two events, `Communicator::submit`, a
    /// work's bookkeeping, `ProcessGroup::all_reduce`.
    #[arg(long, conflicts_with = "enqueue_only")]
    layers: bool,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

struct Timed {
    thread: Thread,
    woke: Mutex<Option<Instant>>,
}

impl Wake for Timed {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let mut w = lock(&self.woke);
        if w.is_none() {
            *w = Some(Instant::now());
        }
        drop(w);
        self.thread.unpark();
    }
}

/// `block_on` that also returns when the waker was first called and when
/// the future completed.
fn block_on_timed<F: Future>(f: F) -> (F::Output, Option<Instant>, Instant) {
    let timed = Arc::new(Timed {
        thread: std::thread::current(),
        woke: Mutex::new(None),
    });
    let waker = Waker::from(timed.clone());
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            let done = Instant::now();
            let woke = *lock(&timed.woke);
            return (out, woke, done);
        }
        std::thread::park();
    }
}

/// Each thread of the process: name, the CPU it last ran on, CPU time
/// (Linux `/proc`), to see where the enqueuing thread and the runtime's
/// threads ran.
fn print_threads() {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return;
    };
    let mut rows = Vec::new();
    for t in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        // "tid (name) state ..." — fields after the name, 1-based from 3.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = &stat[open + 1..close];
        let f: Vec<&str> = stat[close + 2..].split(' ').collect();
        let get = |i: usize| {
            f.get(i - 3)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        rows.push(format!("{name}:cpu{}:{}t", get(39), get(14) + get(15)));
    }
    println!("threads (name:last cpu:cpu ticks): {}", rows.join(" "));
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if args.layers {
        return layers::run(&args);
    }
    let dev = Device::get(args.device)?;
    let kernels = Kernels::load(&dev)?;
    let producer = dev.new_stream(StreamPriority::Normal)?;
    let pg = chorus::test_util::one_rank_group("bench", args.device)?;
    let mut buf = DeviceBuffer::new(producer.clone_htod(&vec![1f32; args.count])?)?;
    // Warm-up.
    for _ in 0..2000 {
        buf = futures::executor::block_on(pg.all_reduce(buf, ReduceOp::Sum)?)?;
    }

    // 1. Enqueue and stream-ordered wait.
    let mut enq = Vec::with_capacity(args.iters);
    let mut so = Vec::with_capacity(args.iters);
    let pause = Duration::from_secs_f64(args.pause_us / 1e6);
    let sync_every = args.sync_every.max(1);
    let events_before = chorus_gpu::nccl::end_events_created();
    let mut most_pending = 0;
    let loop_t0 = Instant::now();
    for i in 0..args.iters {
        if !pause.is_zero() {
            let p0 = Instant::now();
            while p0.elapsed() < pause {
                std::hint::spin_loop();
            }
        }
        let t0 = Instant::now();
        let w = pg.all_reduce(buf, ReduceOp::Sum)?;
        let t1 = Instant::now();
        buf = w.stream_ordered()?;
        let t2 = Instant::now();
        enq.push((t1 - t0).as_secs_f64() * 1e6);
        so.push((t2 - t1).as_secs_f64() * 1e6);
        if i % sync_every == sync_every - 1 {
            most_pending = most_pending.max(pg.pending());
            producer.synchronize()?;
        }
    }
    let loop_us = loop_t0.elapsed().as_secs_f64() * 1e6 / args.iters.max(1) as f64;
    producer.synchronize()?;
    let enq_mean = mean(&enq);
    let so_mean = mean(&so);
    let (enq_med, enq_p99) = (pct(&mut enq, 0.5), pct(&mut enq, 0.99));
    let (so_med, so_p99) = (pct(&mut so, 0.5), pct(&mut so, 0.99));
    if args.enqueue_only {
        println!("enqueue median {enq_med:.2} us p99 {enq_p99:.2} us mean {enq_mean:.2} us; stream_ordered median {so_med:.2} us mean {so_mean:.2} us; loop {loop_us:.2} us/op");
        println!(
            "end events created by the loop {}, most ops pending before a sync {most_pending}",
            chorus_gpu::nccl::end_events_created() - events_before
        );
        if std::env::var_os("NCCL_BENCH_THREADS").is_some() {
            print_threads();
        }
        chorus_benches::print_profile();
        return Ok(());
    }

    let in_progress = chorus_gpu::nccl::in_progress_returns();

    // Breakdown: the driver floor (one event record + one stream wait, and a
    // bare record) and chorus's CPU bookkeeping per op (work, registry entry,
    // flight record, completion).
    let other = dev.new_stream(StreamPriority::Normal)?;
    let ev = dev.new_event()?;
    let k = 20000;
    let t = Instant::now();
    for i in 0..k {
        ev.record(&producer)?;
        other.wait_event(&ev)?;
        if i % 256 == 255 {
            other.synchronize()?;
        }
    }
    let rec_wait_us = t.elapsed().as_secs_f64() * 1e6 / k as f64;
    let t = Instant::now();
    for _ in 0..k {
        ev.record(&producer)?;
    }
    let rec_us = t.elapsed().as_secs_f64() * 1e6 / k as f64;
    producer.synchronize()?;
    other.synchronize()?;
    let reg = Arc::new(chorus_core::Registry::with_recorder(Arc::new(
        chorus_core::flight_recorder::FlightRecorder::new(1024),
    )));
    let group: Arc<str> = "b".into();
    let t = Instant::now();
    for seq in 0..k as u64 {
        chorus_benches::work_bookkeeping_round(&reg, &group, seq)?;
    }
    let book_us = t.elapsed().as_secs_f64() * 1e6 / k as f64;

    // 2. Wake latency. A thread spins on cuEventQuery to timestamp the end
    // event's completion.
    // `pause` spin hints between the observer's queries: 0 is a tight loop
    // (the most exact timestamp, but it competes with the reactor for the
    // driver), 200 is about a microsecond between queries.
    let (tx, rx) = mpsc::channel::<(Arc<EndEvent>, u32)>();
    let (otx, orx) = mpsc::channel::<Instant>();
    let obs_dev = dev.clone();
    let observer = std::thread::spawn(move || {
        let _ = obs_dev.bind_to_thread();
        for (ev, pause) in rx {
            loop {
                match ev.event().query() {
                    Ok(true) => break,
                    Ok(false) => {
                        for _ in 0..=pause {
                            std::hint::spin_loop();
                        }
                    }
                    Err(_) => break,
                }
            }
            if otx.send(Instant::now()).is_err() {
                break;
            }
        }
    });
    let mut wake_rows = Vec::new();
    for (spin, pause) in args.spin_us.iter().flat_map(|&s| [(s, 0u32), (s, 200u32)]) {
        let mut to_wake = Vec::with_capacity(args.wake_iters);
        let mut to_resume = Vec::with_capacity(args.wake_iters);
        for _ in 0..args.wake_iters {
            kernels.spin(&producer, Duration::from_micros(spin))?;
            let w = pg.all_reduce(buf, ReduceOp::Sum)?;
            tx.send((w.end_event_handle(), pause))?;
            let (out, woke, resumed) = block_on_timed(w);
            buf = out?;
            let seen = orx.recv()?;
            let signed = |t: Instant| {
                if t >= seen {
                    (t - seen).as_secs_f64() * 1e6
                } else {
                    -((seen - t).as_secs_f64() * 1e6)
                }
            };
            if let Some(wk) = woke {
                to_wake.push(signed(wk));
            }
            to_resume.push(signed(resumed));
        }
        wake_rows.push((
            spin,
            pause,
            pct(&mut to_wake, 0.5),
            pct(&mut to_wake, 0.99),
            pct(&mut to_resume, 0.5),
            pct(&mut to_resume, 0.99),
            to_wake.len(),
        ));
    }
    drop(tx);
    let _ = observer.join();

    // 3. Awaited round trips.
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed().as_secs_f64() < args.seconds {
        buf = futures::executor::block_on(pg.all_reduce(buf, ReduceOp::Sum)?)?;
        n += 1;
    }
    let rt_per_s = n as f64 / t0.elapsed().as_secs_f64();
    // Blocking wait variant.
    let t0 = Instant::now();
    let mut m = 0u64;
    while t0.elapsed().as_secs_f64() < args.seconds / 2.0 {
        buf = pg
            .all_reduce(buf, ReduceOp::Sum)?
            .wait_timeout(Duration::from_secs(10))?;
        m += 1;
    }
    let rt_wait_per_s = m as f64 / t0.elapsed().as_secs_f64();
    let check = producer.clone_dtoh(buf.slice())?;
    assert!(
        check.iter().all(|&x| x == 1.0),
        "sum over 1 rank keeps the data"
    );

    println!(
        "chorus NCCL backend, device {} ({}), {} x f32",
        args.device,
        dev.name()?,
        args.count
    );
    println!("enqueue (all_reduce call)     median {enq_med:.2} us  p99 {enq_p99:.2} us  mean {enq_mean:.2} us");
    println!("stream_ordered()              median {so_med:.2} us  p99 {so_p99:.2} us  mean {so_mean:.2} us");
    for (spin, pause, wm, wp, rm, rp, k) in &wake_rows {
        println!("wake after {spin} us kernel (observer pause {pause}): waker called median {wm:.2} us p99 {wp:.2} us; thread resumed median {rm:.2} us p99 {rp:.2} us ({k} samples)");
    }
    println!("awaited round trips (block_on)  {rt_per_s:.0} /s");
    println!("round trips (wait_timeout)      {rt_wait_per_s:.0} /s");
    println!("breakdown: cuEventRecord+cuStreamWaitEvent {rec_wait_us:.2} us, cuEventRecord alone {rec_us:.2} us, work+registry+flight-record bookkeeping {book_us:.2} us, ncclInProgress returns {in_progress}");
    chorus_benches::print_profile();
    println!("reactor: {:?}", chorus_gpu::reactor::global().stats());
    if let Some(path) = args.json {
        let wake: Vec<String> = wake_rows
            .iter()
            .map(|(s, pause, wm, wp, rm, rp, k)| format!(
                "{{\"spin_us\":{s},\"observer_pause\":{pause},\"wake_median_us\":{wm:.3},\"wake_p99_us\":{wp:.3},\"resume_median_us\":{rm:.3},\"resume_p99_us\":{rp:.3},\"samples\":{k}}}"
            ))
            .collect();
        let json = format!(
            "{{\"count\":{},\"enqueue_median_us\":{enq_med:.3},\"enqueue_p99_us\":{enq_p99:.3},\"enqueue_mean_us\":{enq_mean:.3},\"stream_ordered_median_us\":{so_med:.3},\"stream_ordered_p99_us\":{so_p99:.3},\"stream_ordered_mean_us\":{so_mean:.3},\"wake\":[{}],\"round_trips_per_s\":{rt_per_s:.0},\"round_trips_wait_timeout_per_s\":{rt_wait_per_s:.0},\"record_wait_us\":{rec_wait_us:.3},\"record_us\":{rec_us:.3},\"bookkeeping_us\":{book_us:.3},\"in_progress_returns\":{in_progress}}}\n",
            args.count,
            wake.join(",")
        );
        std::fs::write(path, json)?;
    }
    Ok(())
}
