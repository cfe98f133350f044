//! How fast, and at what CPU cost, can a host thread learn that a long GPU
//! op ended? Raw mechanisms side by side, without chorus:
//!
//! * `spin`: the waiting thread spins on `cuEventQuery` (the latency
//!   floor; one core busy);
//! * `park-spinner`: the waiting thread parks; a helper thread spins on
//!   `cuEventQuery` and unparks it (what waking a parked thread costs after
//!   it slept as long as the op ran);
//! * `sleep10`, `sleep30`, `sleep100`: `cuEventQuery`, then a sleep of that
//!   many µs (timer slack 1 µs), in a loop;
//! * `presleepM`: the waiting thread sleeps until M µs before the op's known
//!   end, then spins on `cuEventQuery` (what a perfect prediction of the
//!   end would buy);
//! * `sync`: `cuEventSynchronize` on an ordinary event (the driver spins);
//! * `bsync`: `cuEventSynchronize` on a blocking-sync event, on the waiting
//!   thread itself (the driver sleeps until the GPU's interrupt);
//! * `bsync-waiter`: the same on a waiter thread, which then unparks the
//!   waiting thread (two wake-ups: what a completion thread costs);
//! * `hostfn`: a host function on a side stream that waits for the event
//!   (`cuLaunchHostFunc`); it unparks the waiting thread.
//! * `chorus-block_on`, `chorus-tokio-ct`, `chorus-tokio-mt`,
//!   `chorus-wait_timeout`: chorus itself, a 1-rank all_reduce whose input
//!   comes from the stream, `.await`ed under `futures::executor::block_on`,
//!   a tokio current-thread runtime, a task spawned on a multi-thread
//!   runtime (timed inside the task, right after the await), or
//!   `wait_timeout`; `chorus-tokio-mt-join` times the spawned task where its
//!   `JoinHandle` is awaited instead (one more wake-up, of the thread that
//!   awaits the handle); `chorus-group-block_on`, `chorus-group-tokio-ct`,
//!   … the same op staged in a group and awaited through its work (a view
//!   of the group's one work); `chorus-slow-waker`: `.await`ed on a
//!   `block_on` whose waker sleeps `--wake-delay-us` before it unparks the
//!   waiting thread, as a host whose parked threads run again late (the
//!   pre-wake's lead then grows to cover the delay where
//!   `CHORUS_REACTOR_PREWAKE_MAX_US` allows).
//!   Its stamp is the end of the op's input: the op's own few microseconds
//!   on the GPU count as latency.
//!
//! Each sample: a handshake kernel that stamps the GPU clock as soon as it
//! sees a flag the host sets at a noted instant, a spin kernel of the given
//! length, a kernel that stamps the GPU clock again, the event; the waiting
//! thread waits by the mechanism and notes the host clock. Latency = that
//! host instant minus the end's host time: the handshake's host instant
//! plus the GPU time between the two stamps (the handshake reaches the GPU
//! a PCIe write after the host's instant, so the latency errs high by about
//! a microsecond; measuring across one sample, it has no clock drift). "Crude" = the host instant minus the host instant
//! before the spin kernel's launch, minus its length (how PyTorch's side
//! is measured, `torch_wake.py`). CPU = the process's user + system time
//! over the samples divided by their wall time (and per sample, less the
//! handshake's spinning: what one awaited op cost), and for chorus by thread
//! (each thread's time on a CPU from `/proc`, summed by thread name; the
//! waiting thread's includes the handshake's spinning). Also: what recording each
//! kind of event costs.
//!
//! ```sh
//! wake_probe [--samples 200] [--lengths-us 100,1000,3000,10000,30000] [--mechanisms ...]
//! ```
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::Thread;
use std::time::{Duration, Instant};

use chorus_gpu::cuda::kernels::Kernels;
use chorus_gpu::cuda::{Device, Event, GpuClock, HostSlots, Stream, StreamPriority};
use clap::Parser;

#[derive(Parser, Debug)]
struct Args {
    /// Samples per mechanism and length (lengths of 10 ms and more get half).
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// Op lengths, in microseconds.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "100,1000,3000,10000,30000"
    )]
    lengths_us: Vec<u64>,
    /// Mechanisms to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "chorus-block_on,chorus-tokio-ct,chorus-tokio-mt,chorus-wait_timeout,spin,park-spinner,presleep100,presleep300,sleep10,sleep100,bsync"
    )]
    mechanisms: Vec<String>,
    /// The delay of `chorus-slow-waker`'s waker, in microseconds.
    #[arg(long, default_value_t = 1000)]
    wake_delay_us: u64,
    /// For chorus's mechanisms, list every sample slower than this (µs)
    /// with what its pre-wake did (0: no list).
    #[arg(long, default_value_t = 100.0)]
    tail_us: f64,
}

/// A one-shot flag the waiting thread parks on.
struct Flag {
    set: AtomicBool,
    thread: Thread,
}

impl Flag {
    fn new() -> Arc<Flag> {
        Arc::new(Flag {
            set: AtomicBool::new(false),
            thread: std::thread::current(),
        })
    }
    fn raise(&self) {
        self.set.store(true, Ordering::Release);
        self.thread.unpark();
    }
    fn wait(&self) {
        while !self.set.load(Ordering::Acquire) {
            std::thread::park();
        }
    }
}

/// A waiter thread: blocks in `cuEventSynchronize` on each event it is
/// handed, then raises its flag.
struct Waiter {
    tx: mpsc::Sender<(Arc<Event>, Arc<Flag>)>,
}

impl Waiter {
    /// A thread that waits for each event it is handed, by
    /// `cuEventSynchronize` (`spin: false`) or by spinning on
    /// `cuEventQuery`, then raises its flag.
    fn start(device: Device, spin: bool) -> Waiter {
        let (tx, rx) = mpsc::channel::<(Arc<Event>, Arc<Flag>)>();
        std::thread::spawn(move || {
            let _ = device.bind_to_thread();
            for (ev, flag) in rx {
                if spin {
                    while !ev.query().unwrap_or(true) {}
                } else {
                    let _ = ev.synchronize();
                }
                flag.raise();
            }
        });
        Waiter { tx }
    }

    fn wait(&self, ev: &Arc<Event>) {
        let flag = Flag::new();
        self.tx.send((ev.clone(), flag.clone())).expect("waiter");
        flag.wait();
    }
}

/// Wakes a parked thread `delay` after it is woken: a host whose parked
/// threads run again late, on the waker's thread (the reactor's).
struct SlowWaker {
    thread: Thread,
    delay: Duration,
}

impl std::task::Wake for SlowWaker {
    fn wake(self: Arc<Self>) {
        std::thread::sleep(self.delay);
        self.thread.unpark();
    }
}

/// Polls `f` on this thread until it is ready, parking between polls; the
/// waker sleeps `delay` before it unparks (see [`SlowWaker`]).
fn block_on_slow<F: std::future::Future>(f: F, delay: Duration) -> F::Output {
    let mut f = std::pin::pin!(f);
    let waker = std::task::Waker::from(Arc::new(SlowWaker {
        thread: std::thread::current(),
        delay,
    }));
    let mut cx = std::task::Context::from_waker(&waker);
    loop {
        if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// Untimed samples before each mechanism and length.
const WARMUP: usize = 20;

fn cpu_time() -> Duration {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .expect("getrusage");
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    tv(u.user_time()) + tv(u.system_time())
}

/// CPU time so far of each thread of the process, summed by thread name
/// (`/proc/self/task/*/schedstat`: nanoseconds on a CPU, exact), so that a
/// mechanism's CPU can be told apart by who spent it. Empty where `/proc`
/// has no such files.
fn thread_cpu() -> std::collections::BTreeMap<String, u64> {
    let mut by_name = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return by_name;
    };
    for t in tasks.flatten() {
        let dir = t.path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let ns = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
        if let Some(ns) = ns {
            *by_name.entry(name.trim().to_string()).or_insert(0) += ns;
        }
    }
    by_name
}

/// The threads' CPU between two [`thread_cpu`] readings, in % of `wall`,
/// largest first (threads under 0.05 % left out).
fn thread_cpu_line(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
    wall: f64,
) -> String {
    let mut v: Vec<(f64, &str)> = after
        .iter()
        .map(|(name, ns)| {
            let d = ns.saturating_sub(before.get(name).copied().unwrap_or(0));
            (100.0 * d as f64 * 1e-9 / wall, name.as_str())
        })
        .filter(|(p, _)| *p >= 0.05)
        .collect();
    v.sort_by(|a, b| b.0.total_cmp(&a.0));
    v.iter()
        .map(|(p, n)| format!("{n} {p:.2}%"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

struct Rig {
    pg: chorus::ProcessGroup,
    buf: std::cell::RefCell<Option<chorus::DeviceBuffer<f32>>>,
    tokio_ct: tokio::runtime::Runtime,
    tokio_mt: tokio::runtime::Runtime,
    device: Device,
    stream: Stream,
    side: Stream,
    kernels: Kernels,
    slots: HostSlots,
    clock: GpuClock,
    waiter: Waiter,
    spinner: Waiter,
    /// `chorus-slow-waker`'s delay.
    wake_delay: Duration,
}

impl Rig {
    /// One sample: latency (µs) from the stamp to the waiting thread
    /// running again, and the crude latency (µs).
    fn sample(&self, mech: &str, len: Duration, ev: &Arc<Event>) -> (f64, f64) {
        // Slots: 0 the handshake flag, 1 its GPU stamp, 2 the end's stamp.
        for i in 0..3 {
            self.slots.set(i, 0);
        }
        self.kernels
            .wait_flag(&self.stream, &self.slots, 0, 1)
            .expect("handshake");
        let t = Instant::now();
        while t.elapsed() < Duration::from_micros(100) {
            std::hint::spin_loop();
        }
        let launched = Instant::now();
        let flagged = self.clock.host_ns(launched);
        self.slots.set(0, 1);
        self.kernels.spin(&self.stream, len).expect("spin");
        self.kernels
            .stamp(&self.stream, &self.slots, 2)
            .expect("stamp");
        if let Some(kind) = mech.strip_prefix("chorus-") {
            let buf = self.buf.borrow_mut().take().expect("buffer");
            // `chorus-group-*`: the op staged in a group (of one) and
            // awaited through its work, a view of the group's one work.
            let (kind, work) = match kind.strip_prefix("group-") {
                Some(k) => {
                    let w = self
                        .pg
                        .grouped(|g| {
                            g.all_reduce(buf, chorus::ReduceOp::Sum)
                                .map_err(|r| r.error)
                        })
                        .expect("group");
                    (k, w.into_work().expect("launched"))
                }
                None => (
                    kind,
                    self.pg
                        .all_reduce(buf, chorus::ReduceOp::Sum)
                        .expect("all_reduce"),
                ),
            };
            // When the awaiting code runs again: after the await, on the
            // thread that awaited (for a spawned task: inside the task, not
            // where its JoinHandle is awaited; `tokio-mt-join` adds that
            // hop, which any spawned future pays).
            let (back, resumed) = match kind {
                "block_on" => (futures::executor::block_on(work), None),
                "slow-waker" => (block_on_slow(work, self.wake_delay), None),
                "tokio-ct" => (self.tokio_ct.block_on(work), None),
                "tokio-mt" => {
                    let (r, at) = self.tokio_mt.block_on(async {
                        tokio::spawn(async move {
                            let r = work.await;
                            (r, Instant::now())
                        })
                        .await
                        .expect("task")
                    });
                    (r, Some(at))
                }
                "tokio-mt-join" => (
                    self.tokio_mt
                        .block_on(async { tokio::spawn(work).await.expect("task") }),
                    None,
                ),
                "wait_timeout" => (work.wait_timeout(Duration::from_secs(10)), None),
                other => panic!("unknown mechanism chorus-{other}"),
            };
            let back = back.expect("op");
            return self.latencies(mech, (launched, flagged), len, Some(back), resumed);
        }
        ev.record(&self.stream).expect("record");
        match mech {
            "spin" => while !ev.query().expect("query") {},
            m if m.starts_with("presleep") => {
                let margin: u64 = m["presleep".len()..].parse().expect("presleep margin");
                let until = launched + len.saturating_sub(Duration::from_micros(margin));
                std::thread::sleep(until.saturating_duration_since(Instant::now()));
                while !ev.query().expect("query") {}
            }
            "park-spinner" => self.spinner.wait(ev),
            "sleep10" | "sleep30" | "sleep100" => {
                let us: u64 = mech["sleep".len()..].parse().expect("sleep length");
                while !ev.query().expect("query") {
                    std::thread::sleep(Duration::from_micros(us));
                }
            }
            "sync" | "bsync" => ev.synchronize().expect("synchronize"),
            "bsync-waiter" => self.waiter.wait(ev),
            "hostfn" => {
                let flag = Flag::new();
                self.side.wait_event(ev).expect("side wait");
                let f = flag.clone();
                self.side
                    .launch_host_fn(move || f.raise())
                    .expect("host fn");
                flag.wait();
            }
            other => panic!("unknown mechanism {other}"),
        }
        self.latencies(mech, (launched, flagged), len, None, None)
    }

    fn latencies(
        &self,
        mech: &str,
        (launched, flagged): (Instant, i128),
        len: Duration,
        buf: Option<chorus::DeviceBuffer<f32>>,
        resumed: Option<Instant>,
    ) -> (f64, f64) {
        let back = match resumed {
            Some(at) => self.clock.host_ns(at),
            None => self.clock.now_ns(),
        };
        let crude = (resumed.unwrap_or_else(Instant::now) - launched).as_secs_f64() * 1e6
            - len.as_secs_f64() * 1e6;
        if let Some(b) = buf {
            *self.buf.borrow_mut() = Some(b);
        }
        let (g0, g1) = (self.slots.get(1), self.slots.get(2));
        assert!(g0 != 0 && g1 != 0, "{mech}: the stamp kernels have not run");
        let end = flagged + (g1 as i128 - g0 as i128);
        ((back - end) as f64 / 1e3, crude)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    // Sleeps as asked: 1 µs of timer slack instead of 50.
    nix::sys::prctl::set_timerslack(1000)?;
    let device = Device::get(0)?;
    device.bind_to_thread()?;
    let stream = device.new_stream(StreamPriority::Normal)?;
    let side = device.new_stream(StreamPriority::Normal)?;
    let kernels = Kernels::load(&device)?;
    let clock = GpuClock::calibrate(&kernels, &stream, 50)?;
    println!(
        "wake_probe on device 0 ({}); GPU clock calibrated, handshake spread {:.2} us",
        device.name()?,
        clock.spread_ns() as f64 / 1e3
    );
    let store: Arc<dyn chorus::store::Store> = Arc::new(chorus::store::InMemoryStore::new());
    let pg = futures::executor::block_on(
        chorus::ProcessGroup::builder()
            .rank(0)
            .world_size(1)
            .store(store)
            .device(0)
            .name("wake_probe")
            .build(),
    )?;
    let buf = chorus::DeviceBuffer::on_stream(stream.clone_htod(&[1.0f32; 256])?, stream.clone())?;
    let rig = Rig {
        pg,
        buf: std::cell::RefCell::new(Some(buf)),
        tokio_ct: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        tokio_mt: tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?,
        waiter: Waiter::start(device.clone(), false),
        spinner: Waiter::start(device.clone(), true),
        wake_delay: Duration::from_micros(args.wake_delay_us),
        slots: HostSlots::new(&device, 3)?,
        device,
        stream,
        side,
        kernels,
        clock,
    };

    // What recording each kind of event costs on the enqueue path.
    for (name, ev) in [
        ("ordinary", rig.device.new_event()?),
        ("blocking-sync", rig.device.new_blocking_event()?),
    ] {
        let mut t = Vec::with_capacity(20_000);
        for i in 0..20_000 {
            let s = Instant::now();
            ev.record(&rig.stream)?;
            t.push(s.elapsed().as_secs_f64() * 1e6);
            if i % 1000 == 999 {
                rig.stream.synchronize()?;
            }
        }
        rig.stream.synchronize()?;
        println!(
            "cuEventRecord, {name} event: median {:.3} us, p99 {:.3} us",
            pct(&mut t, 0.5),
            pct(&mut t, 0.99)
        );
    }

    for mech in &args.mechanisms {
        let ev = Arc::new(match mech.as_str() {
            "bsync" | "bsync-waiter" => rig.device.new_blocking_event()?,
            _ => rig.device.new_event()?,
        });
        for &us in &args.lengths_us {
            let len = Duration::from_micros(us);
            let n = if us >= 10_000 {
                args.samples / 2
            } else {
                args.samples
            }
            .max(10);
            eprintln!("wake_probe: {mech} {us} us");
            // Warm-up: chorus learns how long ops like these take (a
            // training step's ops repeat); the samples then measure the
            // steady state.
            for _ in 0..WARMUP {
                rig.sample(mech, len, &ev);
            }
            let pw0 = chorus::test_util::prewake_counts();
            let (cpu0, wall0, threads0) = (cpu_time(), Instant::now(), thread_cpu());
            // Per sample: latency, crude latency, and the pre-wakes given
            // and seen while watching during it.
            let mut tails = Vec::new();
            let (mut lat, mut crude): (Vec<f64>, Vec<f64>) = (0..n)
                .map(|i| {
                    let before = chorus::test_util::prewake_counts();
                    let (l, c) = rig.sample(mech, len, &ev);
                    let after = chorus::test_util::prewake_counts();
                    if args.tail_us > 0.0 && l > args.tail_us && mech.starts_with("chorus-") {
                        tails.push((i, l, after.0 - before.0, after.1 - before.1));
                    }
                    (l, c)
                })
                .unzip();
            let cpu = cpu_time().saturating_sub(cpu0).as_secs_f64();
            let wall = wall0.elapsed().as_secs_f64();
            let threads = thread_cpu_line(&threads0, &thread_cpu(), wall);
            // The handshake's 100 µs of host spinning per sample is the
            // probe's, not the mechanism's.
            let own = (cpu - n as f64 * 100e-6).max(0.0);
            println!(
                "{mech:<19} {:>6} us op: latency median {:7.2} us  p99 {:7.2} us  max {:7.2} us; crude median {:7.2} us; CPU {:5.1}% of a core, {:5.1}% less the probe's handshake, {:6.1} us per op ({n} samples)",
                us,
                pct(&mut lat, 0.5),
                pct(&mut lat, 0.99),
                pct(&mut lat, 1.0),
                pct(&mut crude, 0.5),
                100.0 * cpu / wall,
                100.0 * own / wall,
                1e6 * own / n as f64,
            );
            if mech.starts_with("chorus-") {
                let pw = chorus::test_util::prewake_counts();
                println!(
                    "{:<19} {:>6}          pre-wakes {}, of which seen end while watching {}; lead now {:.0} us",
                    "",
                    "",
                    pw.0 - pw0.0,
                    pw.1 - pw0.1,
                    chorus_gpu::reactor::global().prewake_lead().as_secs_f64() * 1e6
                );
                println!("{:<19} {:>6}          CPU by thread: {threads}", "", "");
                for (i, l, given, seen) in &tails {
                    println!(
                        "{:<19} {:>6}          slow sample {i}: {l:.1} us, pre-wakes {given}, seen while watching {seen}",
                        "", ""
                    );
                }
            }
        }
    }
    Ok(())
}
