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
//!   end would buy); `tokio-mt-presleepM` the same in a task spawned on the
//!   multi-thread runtime as `chorus-tokio-mt`'s, timed inside the task
//!   (what the executor's part costs any waiter there);
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
//!   awaits the handle); `chorus-tokio-mt-task` runs each cell's samples,
//!   their start and submission included, in one task on a worker of the
//!   multi-thread runtime, as a trainer's task awaits its ops there (no
//!   task spawned and joined per op: the reactor's wake-up of the worker
//!   is the only hop); `chorus-group-block_on`, `chorus-group-tokio-ct`,
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
//! plus the GPU time between the two stamps, in host time (the handshake
//! reaches the GPU a PCIe write after the host's instant, so the latency
//! errs high by about a microsecond). The GPU's clock runs at its own rate,
//! not quite the host's (+12 ppm on the H200 hosts measured, 0.4 µs over a
//! 30 ms op), so the GPU time is converted at the rate that the handshakes
//! of each cell's own samples show (their offsets from the first samples
//! to the last), printed per cell. "Crude" =
//! the host instant minus the host instant before the spin kernel's launch,
//! minus its length (how PyTorch's side is measured, `torch_wake.py`),
//! converted the same way. CPU = the process's user + system time
//! over the samples divided by their wall time (and per sample, less the
//! handshake's spinning: what one awaited op cost), and by thread (each
//! thread's time on a CPU from `/proc`, summed by thread name, with how
//! many times per sample it ran on a CPU: its wake-ups and preemptions;
//! the waiting thread's includes the handshake's spinning). Also: what
//! recording each kind of event costs.
//!
//! Patterns (`--patterns`): `fixed` runs each length of `--lengths-us` in
//! a cell of its own, after warm-up samples of the same length (the steady
//! state of a training step's ops, whose lengths repeat); `random` draws
//! each sample's length at random, log-uniform from 0.1 to 30 ms
//! (`--random-samples`), and reports it by length band; `rising` runs
//! steps of 1, 3, 7 and 20 ms (`--rising-samples` each, `--rising-cycles`
//! times), so that each new length follows a history of another, and
//! reports it by length. Both draw from a fixed seed (the same lengths in
//! every run and in `torch_wake.py`), after warm-up samples drawn at
//! random.
//!
//! ```sh
//! wake_probe [--samples 200] [--lengths-us 100,1000,3000,10000,30000] [--mechanisms ...]
//!            [--patterns fixed,random,rising] [--random-samples 200] [--rising-samples 12] [--rising-cycles 3]
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
        default_value = "chorus-block_on,chorus-tokio-ct,chorus-tokio-mt-task,chorus-tokio-mt,chorus-wait_timeout,spin,park-spinner,presleep100,presleep300,sleep10,sleep100,bsync"
    )]
    mechanisms: Vec<String>,
    /// The delay of `chorus-slow-waker`'s waker, in microseconds.
    #[arg(long, default_value_t = 1000)]
    wake_delay_us: u64,
    /// For chorus's mechanisms, list every sample slower than this (µs)
    /// with what its pre-wake did (0: no list).
    #[arg(long, default_value_t = 100.0)]
    tail_us: f64,
    /// Patterns of op lengths: `fixed`, `random`, `rising` (see the module
    /// docs).
    #[arg(long, value_delimiter = ',', default_value = "fixed")]
    patterns: Vec<String>,
    /// Samples of the `random` pattern per mechanism.
    #[arg(long, default_value_t = 200)]
    random_samples: usize,
    /// Samples per step of the `rising` pattern.
    #[arg(long, default_value_t = 12)]
    rising_samples: usize,
    /// Times the `rising` pattern's steps run.
    #[arg(long, default_value_t = 3)]
    rising_cycles: usize,
}

/// The steps of the `rising` pattern, µs.
const RISING_US: [u64; 4] = [1_000, 3_000, 7_000, 20_000];

/// The bands the `random` pattern is reported by, µs (lower bounds; the
/// last band ends at 30 ms).
const BANDS_US: [u64; 5] = [100, 300, 1_000, 3_000, 10_000];

/// Lengths drawn log-uniform from 0.1 to 30 ms by xorshift64 from `seed`:
/// the same sequence as `torch_wake.py`'s.
fn random_lengths(n: usize, seed: u64) -> Vec<Duration> {
    let mut x = seed.max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let u = (x >> 11) as f64 / (1u64 << 53) as f64;
            let us = 100.0 * (300.0f64).powf(u);
            Duration::from_micros(us as u64)
        })
        .collect()
}

/// The `rising` pattern's lengths.
fn rising_lengths(per_step: usize, cycles: usize) -> Vec<Duration> {
    (0..cycles)
        .flat_map(|_| RISING_US.iter())
        .flat_map(|&us| std::iter::repeat_n(Duration::from_micros(us), per_step))
        .collect()
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

/// CPU time so far of each thread of the process and how many times it
/// was scheduled in, summed by thread name (`/proc/self/task/*/schedstat`:
/// nanoseconds on a CPU, exact, and the count of its runs on a CPU, which
/// is its wake-ups and preemptions), so that a mechanism's CPU can be told
/// apart by who spent it and how often that thread woke. Empty where
/// `/proc` has no such files.
fn thread_cpu() -> std::collections::BTreeMap<String, (u64, u64)> {
    let mut by_name = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return by_name;
    };
    for t in tasks.flatten() {
        let dir = t.path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(dir.join("schedstat")).unwrap_or_default();
        let mut fields = stat.split_whitespace().map(|f| f.parse::<u64>().ok());
        if let (Some(Some(ns)), Some(_), Some(Some(runs))) =
            (fields.next(), fields.next(), fields.next())
        {
            let e = by_name
                .entry(name.trim().to_string())
                .or_insert((0u64, 0u64));
            e.0 += ns;
            e.1 += runs;
        }
    }
    by_name
}

/// The threads' CPU between two [`thread_cpu`] readings, in % of `wall`,
/// and their runs on a CPU per sample of `n`, largest first (threads
/// under 0.05 % left out).
fn thread_cpu_line(
    before: &std::collections::BTreeMap<String, (u64, u64)>,
    after: &std::collections::BTreeMap<String, (u64, u64)>,
    wall: f64,
    n: usize,
) -> String {
    let mut v: Vec<(f64, f64, &str)> = after
        .iter()
        .map(|(name, &(ns, runs))| {
            let (ns0, runs0) = before.get(name).copied().unwrap_or((0, 0));
            let d = ns.saturating_sub(ns0);
            let r = runs.saturating_sub(runs0) as f64 / n.max(1) as f64;
            (100.0 * d as f64 * 1e-9 / wall, r, name.as_str())
        })
        .filter(|(p, _, _)| *p >= 0.05)
        .collect();
    v.sort_by(|a, b| b.0.total_cmp(&a.0));
    v.iter()
        .map(|(p, r, n)| format!("{n} {p:.2}% ({r:.1} runs per op)"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A sample with the pre-wakes given, and seen while watching, since the
/// counts were `before` (`chorus::test_util::prewake_counts`).
fn with_prewakes(raw: Raw, before: (u64, u64)) -> (Raw, u64, u64) {
    let after = chorus::test_util::prewake_counts();
    (raw, after.0 - before.0, after.1 - before.1)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

struct Rig {
    pg: chorus::ProcessGroup,
    buf: std::sync::Mutex<Option<chorus::DeviceBuffer<f32>>>,
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
    /// A sample's start: its handshake, the spin kernel of `len` and the
    /// kernel that stamps its end, on the probe's stream. Returns the
    /// host instant before the spin kernel's launch and the handshake's
    /// instant on the probe's time line.
    fn start(&self, len: Duration) -> (Instant, i128) {
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
        (launched, flagged)
    }

    /// One `chorus-tokio-mt-task` sample: started, submitted and awaited
    /// inside the task that runs the cell's samples on a worker of the
    /// multi-thread runtime (how a trainer's task awaits its ops there),
    /// timed right after the await.
    async fn sample_in_task(&self, len: Duration) -> Raw {
        let (launched, flagged) = self.start(len);
        let buf = self.buf.lock().expect("buffer").take().expect("buffer");
        let work = self
            .pg
            .all_reduce(buf, chorus::ReduceOp::Sum)
            .expect("all_reduce");
        let back = work.await.expect("op");
        let at = Instant::now();
        self.raw(
            "chorus-tokio-mt-task",
            (launched, flagged),
            Some(back),
            Some(at),
        )
    }

    /// `chorus-tokio-mt-task` samples of the ops' `lens`, each with the
    /// pre-wakes given and seen while watching during it, in one task
    /// spawned on the multi-thread runtime.
    fn samples_in_task(self: &Arc<Self>, lens: &[Duration]) -> Vec<(Raw, u64, u64)> {
        let rig = self.clone();
        let lens = lens.to_vec();
        let task = self.tokio_mt.spawn(async move {
            rig.device.bind_to_thread().expect("bind");
            let mut out = Vec::with_capacity(lens.len());
            for len in lens {
                let before = chorus::test_util::prewake_counts();
                let raw = rig.sample_in_task(len).await;
                out.push(with_prewakes(raw, before));
            }
            out
        });
        self.tokio_mt.block_on(task).expect("task")
    }

    /// Runs `warm` untimed, then `lens` timed, by `mech`: each sample's
    /// timings with the pre-wakes given and seen while watching during
    /// it, and the cell's CPU.
    fn cell(
        self: &Arc<Self>,
        mech: &str,
        ev: &Arc<Event>,
        warm: &[Duration],
        lens: &[Duration],
    ) -> Cell {
        let in_task = mech == "chorus-tokio-mt-task";
        if in_task {
            self.samples_in_task(warm);
        } else {
            for &len in warm {
                self.sample(mech, len, ev);
            }
        }
        let pw0 = chorus::test_util::prewake_counts();
        let (cpu0, wall0, threads0) = (cpu_time(), Instant::now(), thread_cpu());
        let samples: Vec<(Raw, u64, u64)> = if in_task {
            self.samples_in_task(lens)
        } else {
            lens.iter()
                .map(|&len| {
                    let before = chorus::test_util::prewake_counts();
                    let raw = self.sample(mech, len, ev);
                    with_prewakes(raw, before)
                })
                .collect()
        };
        let cpu = cpu_time().saturating_sub(cpu0).as_secs_f64();
        let wall = wall0.elapsed().as_secs_f64();
        let threads = thread_cpu_line(&threads0, &thread_cpu(), wall, lens.len());
        let pw = chorus::test_util::prewake_counts();
        Cell {
            samples,
            lens: lens.to_vec(),
            cpu,
            wall,
            threads,
            prewakes: (pw.0 - pw0.0, pw.1 - pw0.1),
        }
    }

    /// One sample: its handshake, its GPU stamps, and when the waiting
    /// thread ran again.
    fn sample(&self, mech: &str, len: Duration, ev: &Arc<Event>) -> Raw {
        let (launched, flagged) = self.start(len);
        if let Some(kind) = mech.strip_prefix("chorus-") {
            let buf = self.buf.lock().expect("buffer").take().expect("buffer");
            // `chorus-group-*`: the op staged in a group (of one) and
            // awaited through its work, a view of the group's one work.
            let (kind, work) = match kind.strip_prefix("group-") {
                Some(k) => {
                    let w = self
                        .pg
                        .batched(|g| {
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
            return self.raw(mech, (launched, flagged), Some(back), resumed);
        }
        ev.record(&self.stream).expect("record");
        // A raw waiter in a task spawned on the multi-thread runtime, timed
        // inside the task: what the executor's part costs any waiter there.
        if let Some(m) = mech.strip_prefix("tokio-mt-presleep") {
            let margin: u64 = m.parse().expect("presleep margin");
            let until = launched + len.saturating_sub(Duration::from_micros(margin));
            let (ev, device) = (ev.clone(), self.device.clone());
            let at = self.tokio_mt.block_on(async move {
                tokio::spawn(async move {
                    device.bind_to_thread().expect("bind");
                    std::thread::sleep(until.saturating_duration_since(Instant::now()));
                    while !ev.query().expect("query") {}
                    Instant::now()
                })
                .await
                .expect("task")
            });
            return self.raw(mech, (launched, flagged), None, Some(at));
        }
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
        self.raw(mech, (launched, flagged), None, None)
    }

    fn raw(
        &self,
        mech: &str,
        (launched, flagged): (Instant, i128),
        buf: Option<chorus::DeviceBuffer<f32>>,
        resumed: Option<Instant>,
    ) -> Raw {
        let back = match resumed {
            Some(at) => self.clock.host_ns(at),
            None => self.clock.now_ns(),
        };
        let elapsed = (resumed.unwrap_or_else(Instant::now) - launched).as_secs_f64() * 1e6;
        if let Some(b) = buf {
            *self.buf.lock().expect("buffer") = Some(b);
        }
        let (g0, g1) = (self.slots.get(1), self.slots.get(2));
        assert!(
            g0 != 0 && g1 >= g0,
            "{mech}: the stamp kernels have not run"
        );
        Raw {
            flagged,
            g0,
            g1,
            back,
            elapsed,
        }
    }
}

/// A cell's samples, the lengths of their ops, and what the process spent
/// meanwhile.
struct Cell {
    samples: Vec<(Raw, u64, u64)>,
    lens: Vec<Duration>,
    /// CPU time and wall time, s.
    cpu: f64,
    wall: f64,
    threads: String,
    /// Pre-wakes given, and seen end while watching.
    prewakes: (u64, u64),
}

impl Cell {
    fn all(&self) -> Vec<usize> {
        (0..self.samples.len()).collect()
    }

    /// The GPU clock's rate against the host's, from the cell's own
    /// handshakes (see [`clock_drift`]).
    fn drift(&self) -> f64 {
        let raws: Vec<Raw> = self.samples.iter().map(|s| s.0).collect();
        clock_drift(&raws)
    }

    /// Latency median, p99, max and crude median of the samples `idx`, µs.
    fn latency(&self, idx: &[usize]) -> Option<(f64, f64, f64, f64)> {
        if idx.is_empty() {
            return None;
        }
        let drift = self.drift();
        let mut lat: Vec<f64> = idx
            .iter()
            .map(|&i| self.samples[i].0.latency(drift))
            .collect();
        let mut crude: Vec<f64> = idx
            .iter()
            .map(|&i| self.samples[i].0.crude(self.lens[i], drift))
            .collect();
        Some((
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99),
            pct(&mut lat, 1.0),
            pct(&mut crude, 0.5),
        ))
    }

    /// One line: the latency of the samples `idx` under `label`.
    fn print_latency(&self, mech: &str, label: &str, idx: &[usize]) {
        if let Some((med, p99, max, crude)) = self.latency(idx) {
            println!(
                "{mech:<20} {label:>16}: latency median {med:7.2} us  p99 {p99:7.2} us  max {max:7.2} us; crude median {crude:7.2} us ({} samples)",
                idx.len()
            );
        }
    }

    /// The latency of the samples `idx`, then the cell's CPU, by thread,
    /// its clock and pre-wakes, and its slow samples (over `tail_us`).
    fn print(&self, mech: &str, label: &str, idx: &[usize], tail_us: f64) {
        let n = self.samples.len();
        let drift = self.drift();
        // The handshake's 100 µs of host spinning per sample is the
        // probe's, not the mechanism's.
        let own = (self.cpu - n as f64 * 100e-6).max(0.0);
        self.print_latency(mech, label, idx);
        let pad = "";
        println!(
            "{pad:<20} {label:>16}  CPU {:5.1}% of a core, {:5.1}% less the probe's handshake, {:6.1} us per op; GPU clock {:+.1} ppm",
            100.0 * self.cpu / self.wall,
            100.0 * own / self.wall,
            1e6 * own / n as f64,
            drift * 1e6,
        );
        println!("{pad:<20} {label:>16}  CPU by thread: {}", self.threads);
        if mech.starts_with("chorus-") {
            println!(
                "{pad:<20} {label:>16}  pre-wakes {}, of which seen end while watching {}; lead now {:.0} us; reactor {:?}",
                self.prewakes.0,
                self.prewakes.1,
                chorus_gpu::reactor::global().prewake_lead().as_secs_f64() * 1e6,
                chorus_gpu::reactor::global().stats(),
            );
            for (i, (raw, given, seen)) in self.samples.iter().enumerate() {
                let l = raw.latency(drift);
                if tail_us > 0.0 && l > tail_us {
                    println!(
                        "{pad:<20} {label:>16}  slow sample {i} ({} us op): {l:.1} us, pre-wakes {given}, seen while watching {seen}",
                        self.lens[i].as_micros()
                    );
                }
            }
        }
    }
}

/// One sample's timings: host instants in ns on the probe's time line,
/// GPU stamps in the GPU clock's ns.
#[derive(Clone, Copy, Debug)]
struct Raw {
    /// When the host set the handshake's flag.
    flagged: i128,
    /// The GPU's clock when the handshake kernel saw the flag.
    g0: u64,
    /// The GPU's clock when the op's input had ended.
    g1: u64,
    /// When the waiting code ran again.
    back: i128,
    /// From before the spin kernel's launch until the waiting code ran
    /// again, µs.
    elapsed: f64,
}

impl Raw {
    /// The GPU's clock less the host's at the handshake, ns (late by the
    /// flag's PCIe write and whatever held the kernel's look, never early).
    fn offset(&self) -> i128 {
        i128::from(self.g0) - self.flagged
    }

    /// Latency, µs: the host instant the waiting code ran again less the
    /// end's host instant, the handshake's plus the GPU time between the
    /// stamps, converted to host time for a GPU clock that runs `drift`
    /// (a fraction) fast against the host's.
    fn latency(&self, drift: f64) -> f64 {
        let gpu = (self.g1 - self.g0) as f64;
        let end = self.flagged as f64 + gpu / (1.0 + drift);
        (self.back as f64 - end) / 1e3
    }

    /// Crude latency, µs (see the module docs): `elapsed` less the spin
    /// kernel's length `len` (on the GPU's clock) in host time.
    fn crude(&self, len: Duration, drift: f64) -> f64 {
        self.elapsed - len.as_secs_f64() * 1e6 / (1.0 + drift)
    }
}

/// How much faster the GPU's clock ran than the host's over `raws`, in
/// order (a fraction; 0 for fewer than 8 samples): the change of the
/// handshakes' offset from the first samples to the last, each end taken
/// at its smallest offset (a handshake errs late, never early). The
/// estimate's error is the handshakes' jitter over the samples' span, so
/// its share of a sample's latency is that jitter over the number of
/// samples.
fn clock_drift(raws: &[Raw]) -> f64 {
    if raws.len() < 8 {
        return 0.0;
    }
    let k = (raws.len() / 4).min(5);
    let lowest = |s: &[Raw]| s.iter().min_by_key(|r| r.offset()).copied();
    let (Some(a), Some(b)) = (lowest(&raws[..k]), lowest(&raws[raws.len() - k..])) else {
        return 0.0;
    };
    let span = b.flagged - a.flagged;
    if span <= 0 {
        return 0.0;
    }
    (b.offset() - a.offset()) as f64 / span as f64
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
    let pg = chorus::test_util::one_rank_group("wake_probe", 0)?;
    let buf = chorus::DeviceBuffer::on_stream(stream.clone_htod(&[1.0f32; 256])?, stream.clone())?;
    let rig = Arc::new(Rig {
        pg,
        buf: std::sync::Mutex::new(Some(buf)),
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
    });

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
        for pattern in &args.patterns {
            match pattern.as_str() {
                "fixed" => {
                    for &us in &args.lengths_us {
                        let len = Duration::from_micros(us);
                        let n = if us >= 10_000 {
                            args.samples / 2
                        } else {
                            args.samples
                        }
                        .max(10);
                        eprintln!("wake_probe: {mech} {us} us");
                        // Warm-up: chorus learns how long ops like these
                        // take (a training step's ops repeat); the samples
                        // then measure the steady state.
                        let cell = rig.cell(mech, &ev, &[len; WARMUP], &vec![len; n]);
                        let label = format!("{us:>6} us op");
                        cell.print(mech, &label, &cell.all(), args.tail_us);
                    }
                }
                "random" | "rising" => {
                    eprintln!("wake_probe: {mech} {pattern}");
                    let warm = random_lengths(WARMUP, 7);
                    let lens = if pattern == "random" {
                        random_lengths(args.random_samples, 1)
                    } else {
                        rising_lengths(args.rising_samples, args.rising_cycles)
                    };
                    let cell = rig.cell(mech, &ev, &warm, &lens);
                    let groups: Vec<(String, Vec<usize>)> = if pattern == "random" {
                        BANDS_US
                            .iter()
                            .enumerate()
                            .map(|(b, &lo)| {
                                let hi = BANDS_US.get(b + 1).copied().unwrap_or(30_001);
                                let idx = (0..lens.len())
                                    .filter(|&i| {
                                        let us = lens[i].as_micros() as u64;
                                        us >= lo && us < hi
                                    })
                                    .collect();
                                let top = hi.min(30_000) as f64 / 1e3;
                                (format!("random {}-{top} ms", lo as f64 / 1e3), idx)
                            })
                            .collect()
                    } else {
                        RISING_US
                            .iter()
                            .map(|&us| {
                                let idx = (0..lens.len())
                                    .filter(|&i| lens[i].as_micros() as u64 == us)
                                    .collect();
                                (format!("rising {} ms", us / 1000), idx)
                            })
                            .collect()
                    };
                    for (label, idx) in &groups {
                        cell.print_latency(mech, label, idx);
                    }
                    cell.print(mech, &format!("{pattern} all"), &cell.all(), args.tail_us);
                }
                other => panic!("unknown pattern {other}"),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples every `gap` ns of host time on a GPU clock that runs `ppm`
    /// fast, each handshake late by `late(i)` ns, each op `gpu_len` ns on
    /// the GPU's clock, seen `lat` ns late in host time.
    fn samples(n: usize, gap: i128, ppm: f64, late: impl Fn(usize) -> i128, lat: i128) -> Vec<Raw> {
        let gpu_len: u64 = 30_000_000;
        let gpu_at = |host: i128| 5_000_000 + (host as f64 * (1.0 + ppm * 1e-6)) as i128;
        (0..n)
            .map(|i| {
                let flagged = i as i128 * gap;
                let g0 = gpu_at(flagged + late(i)) as u64;
                let g1 = g0 + gpu_len;
                let host_len = (gpu_len as f64 / (1.0 + ppm * 1e-6)) as i128;
                Raw {
                    flagged,
                    g0,
                    g1,
                    back: flagged + late(i) + host_len + lat,
                    elapsed: 0.0,
                }
            })
            .collect()
    }

    #[test]
    fn the_patterns_draw_the_same_lengths_in_range_every_run() {
        let a = random_lengths(2000, 1);
        assert_eq!(a, random_lengths(2000, 1));
        assert_ne!(a, random_lengths(2000, 7));
        let us: Vec<u64> = a.iter().map(|d| d.as_micros() as u64).collect();
        assert!(us.iter().all(|&u| (100..30_000).contains(&u)));
        // Log-uniform: each decade about a third of the draws.
        for (lo, hi) in [(100, 1000), (1000, 10_000), (10_000, 30_000)] {
            let k = us.iter().filter(|&&u| u >= lo && u < hi).count();
            let want = 2000.0 * ((hi as f64).ln() - (lo as f64).ln()) / 300f64.ln();
            assert!(
                (k as f64 - want).abs() < want * 0.15,
                "{lo}-{hi}: {k} of ~{want}"
            );
        }
        // The first draws, as torch_wake.py's generator gives them.
        assert_eq!(
            &us[..4],
            &[
                FIRST_DRAWS[0],
                FIRST_DRAWS[1],
                FIRST_DRAWS[2],
                FIRST_DRAWS[3]
            ]
        );
        let r = rising_lengths(12, 3);
        assert_eq!(r.len(), 12 * 4 * 3);
        assert_eq!(r[0], Duration::from_millis(1));
        assert_eq!(r[12], Duration::from_millis(3));
        assert_eq!(r[47], Duration::from_millis(20));
        assert_eq!(r[48], Duration::from_millis(1));
    }

    /// `random_lengths(_, 1)`'s first draws in µs (torch_wake.py's
    /// `random_lengths` must give the same).
    const FIRST_DRAWS: [u64; 4] = [100, 142, 3169, 23653];

    #[test]
    fn the_gpu_clocks_rate_comes_from_the_lowest_handshakes_at_each_end() {
        // 200 ppm fast, handshakes 1 µs late but for a few far later ones.
        let late = |i: usize| if i % 7 == 3 { 40_000 } else { 1_000 };
        let raws = samples(50, 31_000_000, 200.0, late, 8_000);
        let drift = clock_drift(&raws);
        assert!((drift * 1e6 - 200.0).abs() < 0.5, "{}", drift * 1e6);
        // Converted at that rate, a prompt handshake's sample shows its
        // true 8 µs (and the handshake's 1 µs); with the GPU's clock
        // taken for the host's, 6 µs less (the op's 30 ms on a fast
        // clock).
        let l = raws[0].latency(drift);
        assert!((l - 9.0).abs() < 0.1, "{l}");
        assert!((raws[0].latency(0.0) - 3.0).abs() < 0.1);
        // A clock at the host's rate, and too few samples to tell.
        assert!(clock_drift(&samples(50, 31_000_000, 0.0, late, 0)).abs() < 1e-7);
        assert_eq!(clock_drift(&raws[..7]), 0.0);
    }
}
