//! chorus async trainer: data-parallel training of a small MLP on the CPU,
//! with DDP-style gradient buckets whose all_reduce overlaps the backward
//! pass.
//!
//! Every rank holds a copy of a two-layer MLP (tanh hidden layer, one linear
//! output) and trains it on its shard of a synthetic regression set. The
//! gradient is cut into buckets in the order backward produces it; as soon
//! as a bucket is complete its `all_reduce(Avg)` is submitted (submission is
//! eager, so the backend works on it while backward computes the next
//! buckets) and every bucket is awaited just before the optimizer step.
//!
//! Checked on every run: the loss falls to below half its initial value, and
//! the parameters of every rank are bit-identical after every step (a 64-bit
//! hash of them is all_gathered each step; at the end a bitwise min/max
//! all_reduce compares every parameter).
//!
//! ```sh
//! cargo run --release -p chorus-examples --example async_trainer -- --nproc 2
//! # the same without overlap (buckets submitted after backward, as one
//! # group), to compare
//! cargo run --release -p chorus-examples --example async_trainer -- --nproc 2 --sequential
//! # gradients on the GPU through NCCL (one GPU per rank; `auto`, the
//! # default, picks it when every rank has a GPU and NCCL loads)
//! chorus-run --nproc-per-node 2 -- target/release/examples/async_trainer --device cuda
//! ```
//!
//! **GPU variant** (`--device cuda`, or `auto` when every rank finds a GPU
//! — device `LOCAL_RANK` — and NCCL): the model still computes on the CPU,
//! but each bucket is copied into its own device buffer on a per-rank
//! stream and all_reduced by NCCL; the future resolves once the GPU has
//! finished, then the bucket is copied back for the optimizer. The ranks
//! agree on the backend first (an all_reduce of their capability), so a
//! rank without a GPU makes every rank fall back to the TCP backend (or, with
//! `--device cuda`, every rank fail with the reason).
//!
//! **Fault-tolerant variant** (`--fault-tolerant`, host buffers): when a
//! rank dies the survivors keep their parameters, re-form the group, re-shard
//! the data over the new world size and go on; a rank that `chorus-run
//! --max-restarts` restarted rejoins and takes the parameters from the lowest
//! surviving rank by broadcast before its first step (see
//! `fault_tolerant.rs`). It prints the failures seen, the world
//! size of every epoch of the group, and the time from each failure to the
//! first step on the next epoch.
//!
//! ```sh
//! chorus-run --nproc-per-node 3 --max-restarts 1 -- \
//!     target/release/examples/async_trainer --fault-tolerant
//! # (without a launcher it starts its ranks itself, with --max-restarts)
//! ```
//!
//! Overlap, as reported per step (mean over steps and ranks):
//!
//! * *forward+backward*: wall time of this rank's compute.
//! * *busy*: the time the group's worker spent on the bucket all_reduces, from
//!   the flight recorder: an op is busy from when it could start (it was
//!   submitted, and the group's previous op had completed, since a group runs
//!   its ops in order; or when the backend recorded its start, if it does)
//!   until it completed. This includes waiting for slower ranks to submit.
//! * *hidden*: the part of the busy time before backward ended, i.e.
//!   communication that ran while this rank was still computing.
//! * *waited*: wall time from the end of backward until every bucket was
//!   back, which the optimizer step had to wait for.
//! * *step*: wall time of the whole step. Compare it with `--sequential`
//!   (every bucket submitted after backward, so nothing can be hidden) to see
//!   what the overlap is worth on your machine: on a machine with fewer free
//!   cores than ranks need (compute + chorus's I/O threads), the
//!   communication threads compete with the compute for the CPU.
#![forbid(unsafe_code)]

mod fault_tolerant;

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chorus::{Device, Stream, StreamPriority};
use chorus::{DeviceBuffer, DeviceWork, ProcessGroup, ReduceOp, Work};
use chorus_examples::{
    launch_self_if_needed, launch_self_restarting_if_needed, run_rank, BoxError,
};
use clap::Parser;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Input features of the synthetic regression set.
const FEATURES: usize = 32;
/// Hidden units of the (random) teacher network that defines the targets.
const TEACHER_HIDDEN: usize = 16;

#[derive(Parser, Debug, Clone)]
#[command(about = "Data-parallel MLP training with bucketed, overlapped all_reduce")]
struct Args {
    /// Ranks to start when not launched by chorus-run/torchrun/srun.
    #[arg(long, default_value_t = 2)]
    nproc: usize,
    /// Passes over the data set (default 10; 4 with --quick).
    #[arg(long)]
    epochs: Option<usize>,
    /// Hidden units of the MLP (default 256; 32 with --quick).
    #[arg(long)]
    hidden: Option<usize>,
    /// Samples in the data set, over all ranks (default 16384; 2048 with --quick).
    #[arg(long)]
    samples: Option<usize>,
    /// Gradient buckets, each all_reduced on its own (default 4).
    #[arg(long, default_value_t = 4)]
    buckets: usize,
    /// Samples per step on each rank.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Learning rate of SGD with momentum.
    #[arg(long, default_value_t = 0.02)]
    lr: f32,
    /// Momentum of SGD.
    #[arg(long, default_value_t = 0.9)]
    momentum: f32,
    /// Submit the buckets only after backward (no overlap), to compare.
    #[arg(long)]
    sequential: bool,
    /// Seed of the data set and of the initial parameters.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Small sizes and few epochs (for CI).
    #[arg(long)]
    quick: bool,
    /// Where the gradient buckets are all_reduced: `cpu` (TCP backend),
    /// `cuda` (device buffers, NCCL), `auto` (cuda when every rank can).
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    device: DeviceArg,
    /// Test hook: the last rank flips one bit of a parameter after this
    /// step, which the identity check must catch.
    #[arg(long, hide = true)]
    inject_divergence: Option<usize>,
    /// Survive lost ranks: re-form the group and go on; let restarted
    /// ranks rejoin (host buffers only).
    #[arg(long)]
    fault_tolerant: bool,
    /// With --fault-tolerant and no launcher: restarts of failed ranks
    /// allowed (`chorus-run --max-restarts`).
    #[arg(long, default_value_t = 1)]
    max_restarts: u32,
    /// With --fault-tolerant: the members admit restarted ranks every
    /// this many steps.
    #[arg(long, default_value_t = 5)]
    admit_every: usize,
    /// With --fault-tolerant: the re-form window in milliseconds.
    #[arg(long, default_value_t = 1000)]
    reform_window_ms: u64,
    /// Test hook (with --fault-tolerant): `RANK@STEP,...`: that world rank
    /// SIGKILLs itself in that step (on its first start only).
    #[arg(long, hide = true, default_value = "")]
    kill: String,
}

/// Where gradients are all_reduced.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum DeviceArg {
    /// CUDA when every rank has a GPU and NCCL, else the TCP backend.
    Auto,
    /// Host buffers, TCP backend.
    Cpu,
    /// Device buffers, NCCL backend (fails if a rank cannot).
    Cuda,
}

/// The run's sizes, after `--quick` defaults.
#[derive(Debug, Clone, Copy)]
struct Config {
    epochs: usize,
    hidden: usize,
    samples: usize,
    buckets: usize,
    batch: usize,
    lr: f32,
    momentum: f32,
    sequential: bool,
    seed: u64,
    device: DeviceArg,
    inject_divergence: Option<usize>,
}

impl Config {
    fn from_args(a: &Args) -> Result<Config, String> {
        let q = a.quick;
        let c = Config {
            epochs: a.epochs.unwrap_or(if q { 4 } else { 10 }),
            hidden: a.hidden.unwrap_or(if q { 32 } else { 256 }),
            samples: a.samples.unwrap_or(if q { 2048 } else { 16384 }),
            buckets: a.buckets,
            batch: a.batch,
            lr: a.lr,
            momentum: a.momentum,
            sequential: a.sequential,
            seed: a.seed,
            device: a.device,
            inject_divergence: a.inject_divergence,
        };
        if c.epochs == 0 || c.hidden == 0 || c.batch == 0 || c.buckets == 0 {
            return Err("--epochs, --hidden, --batch and --buckets must be at least 1".into());
        }
        if c.buckets > c.hidden {
            return Err(format!(
                "--buckets {} is more than the {} hidden units a bucket boundary can fall between",
                c.buckets, c.hidden
            ));
        }
        Ok(c)
    }
}

/// Microseconds since the Unix epoch: the flight recorder's clock.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A normal sample (Box-Muller), enough for synthetic data.
fn normal(rng: &mut StdRng) -> f32 {
    let u1: f32 = rng.gen_range(f32::EPSILON..1.0);
    let u2: f32 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

/// The synthetic regression set: `y = teacher(x) + noise`, normalized to
/// zero mean and unit variance. Every rank builds the same set and keeps
/// the samples `i` with `i % world == rank`.
struct Shard {
    x: Vec<f32>,
    y: Vec<f32>,
}

impl Shard {
    fn len(&self) -> usize {
        self.y.len()
    }

    fn new(seed: u64, samples: usize, rank: usize, world: usize) -> Shard {
        let mut rng = StdRng::seed_from_u64(seed);
        let tw: Vec<f32> = (0..TEACHER_HIDDEN * FEATURES)
            .map(|_| normal(&mut rng) / (FEATURES as f32).sqrt())
            .collect();
        let tv: Vec<f32> = (0..TEACHER_HIDDEN).map(|_| normal(&mut rng)).collect();
        let mut xs = Vec::with_capacity(samples * FEATURES);
        let mut ys = Vec::with_capacity(samples);
        for _ in 0..samples {
            let x: Vec<f32> = (0..FEATURES).map(|_| normal(&mut rng)).collect();
            let y: f32 = (0..TEACHER_HIDDEN)
                .map(|k| tv[k] * dot(&tw[k * FEATURES..(k + 1) * FEATURES], &x).tanh())
                .sum::<f32>()
                + 0.05 * normal(&mut rng);
            xs.extend_from_slice(&x);
            ys.push(y);
        }
        let mean = ys.iter().map(|&v| v as f64).sum::<f64>() / samples.max(1) as f64;
        let var =
            ys.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / samples.max(1) as f64;
        let sd = var.sqrt().max(1e-6);
        let mut shard = Shard {
            x: Vec::new(),
            y: Vec::new(),
        };
        for i in (rank..samples).step_by(world) {
            shard
                .x
                .extend_from_slice(&xs[i * FEATURES..(i + 1) * FEATURES]);
            shard.y.push(((ys[i] as f64 - mean) / sd) as f32);
        }
        shard
    }

    fn x(&self, i: usize) -> &[f32] {
        &self.x[i * FEATURES..(i + 1) * FEATURES]
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(p, q)| p * q).sum()
}

/// The MLP `y = b2 + Σ_j w2[j] · tanh(b1[j] + w1[j] · x)`, its parameters in
/// one flat vector laid out in the order backward produces their gradients:
/// `w2 (H) | b2 (1) | unit 0: w1[0] (D), b1[0] | unit 1: ... | unit H-1`.
struct Mlp {
    hidden: usize,
    params: Vec<f32>,
}

/// Parameters of hidden unit `j`'s row (weights then bias).
const ROW: usize = FEATURES + 1;

impl Mlp {
    fn new(hidden: usize, seed: u64) -> Mlp {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut params = vec![0.0; hidden + 1 + hidden * ROW];
        for w in &mut params[..hidden] {
            *w = normal(&mut rng) / (hidden as f32).sqrt();
        }
        for j in 0..hidden {
            let o = hidden + 1 + j * ROW;
            for w in &mut params[o..o + FEATURES] {
                *w = normal(&mut rng) / (FEATURES as f32).sqrt();
            }
        }
        Mlp { hidden, params }
    }

    /// Flat offset where hidden unit `j`'s parameters begin.
    fn unit(&self, j: usize) -> usize {
        self.hidden + 1 + j * ROW
    }

    /// The prediction for `x`, leaving the hidden activations in `act`.
    fn predict(&self, x: &[f32], act: &mut [f32]) -> f32 {
        let h = self.hidden;
        let mut y = self.params[h];
        for (j, a) in act.iter_mut().enumerate() {
            let o = self.unit(j);
            *a = (self.params[o + FEATURES] + dot(&self.params[o..o + FEATURES], x)).tanh();
            y += self.params[j] * *a;
        }
        y
    }

    /// Sum of squared errors over every sample of the shard.
    fn sse(&self, data: &Shard) -> f64 {
        let mut act = vec![0.0; self.hidden];
        (0..data.len())
            .map(|i| (self.predict(data.x(i), &mut act) - data.y[i]) as f64)
            .map(|e| e * e)
            .sum()
    }

    /// 64-bit FNV-1a hash of the parameters' bits.
    fn hash(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for p in &self.params {
            for b in p.to_bits().to_le_bytes() {
                h ^= b as u64;
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
        h
    }
}

/// A contiguous range of the flat gradient, all_reduced as one op; it is
/// complete once backward has finished hidden unit `last_unit`.
struct Bucket {
    range: std::ops::Range<usize>,
    last_unit: usize,
    /// The bucket's buffer between steps (it travels into the op and back).
    buf: Vec<f32>,
}

/// Bucket `k` of `n` covers hidden units `[k·H/n, (k+1)·H/n)`; bucket 0 also
/// holds the output layer (whose gradient backward produces first).
fn make_buckets(hidden: usize, n: usize) -> Vec<Bucket> {
    let off = |u: usize| hidden + 1 + u * ROW;
    (0..n)
        .map(|k| {
            let (u0, u1) = (k * hidden / n, (k + 1) * hidden / n);
            let start = if k == 0 { 0 } else { off(u0) };
            Bucket {
                range: start..off(u1),
                last_unit: u1 - 1,
                buf: Vec::with_capacity(off(u1) - start),
            }
        })
        .collect()
}

/// The GPU side of the GPU variant: a stream and one device buffer per
/// bucket (each travels into its all_reduce and back).
struct Gpu {
    stream: Stream,
    bufs: Vec<Option<DeviceBuffer<f32>>>,
}

/// This rank's GPU for `--device`, or why there is none.
fn local_gpu(buckets: &[Bucket]) -> Result<Gpu, String> {
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(d)
    };
    let local = env("LOCAL_RANK", 0);
    let count = chorus::cuda::device_count().map_err(|e| e.to_string())?;
    // `chorus-run --share-gpu` puts every rank on one GPU on purpose.
    let shared = std::env::var_os("CHORUS_SHARE_GPU").is_some();
    if count < env("LOCAL_WORLD_SIZE", 1) && !shared {
        return Err(format!(
            "{count} GPU(s) for {} ranks on this node (NCCL needs one GPU per rank; \
             chorus-run --share-gpu runs them all on one, for tests)",
            env("LOCAL_WORLD_SIZE", 1)
        ));
    }
    chorus::nccl_library().map_err(|e| e.to_string())?;
    let dev = Device::get(local).map_err(|e| e.to_string())?;
    let stream = dev
        .new_stream(StreamPriority::Normal)
        .map_err(|e| e.to_string())?;
    let bufs = buckets
        .iter()
        .map(|b| {
            let slice = stream
                .alloc_zeros::<f32>(b.range.len())
                .map_err(|e| e.to_string())?;
            DeviceBuffer::on_stream(slice, stream.clone())
                .map(Some)
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, String>>()?;
    Ok(Gpu { stream, bufs })
}

/// Picks the backend for the buckets; every rank agrees (a rank that cannot
/// use a GPU makes every rank use the TCP backend, or fail with `--device
/// cuda`).
async fn pick_gpu(
    pg: &ProcessGroup,
    want: DeviceArg,
    buckets: &[Bucket],
) -> Result<Option<Gpu>, BoxError> {
    if want == DeviceArg::Cpu {
        return Ok(None);
    }
    let mine = local_gpu(buckets);
    let all_can = pg
        .all_reduce(vec![u8::from(mine.is_ok())], ReduceOp::Min)?
        .await?[0]
        == 1;
    match (mine, all_can, want) {
        (Ok(gpu), true, _) => Ok(Some(gpu)),
        (Err(why), _, DeviceArg::Cuda) => {
            Err(format!("--device cuda: rank {}: {why}", pg.rank()).into())
        }
        (_, false, DeviceArg::Cuda) => Err("--device cuda: another rank has no usable GPU".into()),
        _ => Ok(None),
    }
}

/// A bucket's all_reduce in flight, on either backend.
enum BucketWork {
    Host(Work<Vec<f32>>),
    Device(usize, DeviceWork<DeviceBuffer<f32>>),
}

impl BucketWork {
    fn seq(&self) -> u64 {
        match self {
            BucketWork::Host(w) => w.seq(),
            BucketWork::Device(_, w) => w.seq(),
        }
    }

    /// Awaits the bucket and writes the averaged gradient into `grads`.
    async fn finish(
        self,
        bk: &mut Bucket,
        gpu: &mut Option<Gpu>,
        grads: &mut [f32],
    ) -> Result<(), BoxError> {
        match (self, gpu) {
            (BucketWork::Host(w), _) => {
                bk.buf = w.await?;
                grads[bk.range.clone()].copy_from_slice(&bk.buf);
            }
            (BucketWork::Device(k, w), Some(gpu)) => {
                let db = w.await?;
                let host = gpu.stream.clone_dtoh(db.slice())?;
                grads[bk.range.clone()].copy_from_slice(&host);
                gpu.bufs[k] = Some(db);
            }
            (BucketWork::Device(..), None) => return Err("a device bucket without a GPU".into()),
        }
        Ok(())
    }
}

/// The all_gather of every rank's parameter hash after a step.
type HashGather = Work<(Vec<i64>, Vec<i64>)>;

/// What one step leaves for the overlap accounting.
struct StepTimes {
    /// Step start and end of backward (µs since the epoch).
    start_us: u64,
    backward_end_us: u64,
    /// Sequence numbers of the bucket all_reduces.
    seqs: Vec<u64>,
}

/// Overlap totals, in µs.
#[derive(Default, Clone, Copy)]
struct Overlap {
    /// Wall time of the steps (forward to the hash check's submission).
    steps: f64,
    comm_busy: f64,
    hidden: f64,
    waited: f64,
    compute: f64,
}

/// Adds the steps' bucket intervals, read from the group's flight recorder.
fn account(pg: &ProcessGroup, steps: &mut Vec<StepTimes>, total: &mut Overlap) {
    if steps.is_empty() {
        return;
    }
    let records = pg.flight_record();
    let by_seq: std::collections::HashMap<u64, &chorus::flight_recorder::OpRecord> = records
        .iter()
        .filter(|r| r.collective)
        .map(|r| (r.seq, r))
        .collect();
    for st in steps.drain(..) {
        let mut spans: Vec<(u64, u64)> = Vec::new();
        for &seq in &st.seqs {
            let Some(r) = by_seq.get(&seq) else { continue };
            let Some(end) = r.completed_us else { continue };
            // The TCP backend runs a group's ops in order: an op cannot have
            // been busy before the previous op completed.
            let prev_end = by_seq
                .get(&(seq - 1))
                .and_then(|p| p.completed_us)
                .unwrap_or(0);
            let start = r.started_us.unwrap_or(r.scheduled_us).max(prev_end);
            spans.push((start.min(end), end));
        }
        spans.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (s, e) in spans {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        for (s, e) in merged {
            total.comm_busy += (e - s) as f64;
            let (hs, he) = (s.max(st.start_us), e.min(st.backward_end_us));
            if he > hs {
                total.hidden += (he - hs) as f64;
            }
        }
    }
}

fn bar(done: usize, total: usize, width: usize) -> String {
    let filled = done * width / total.max(1);
    format!("[{}{}]", "#".repeat(filled), "-".repeat(width - filled))
}

struct Outcome {
    ok: bool,
}

async fn train(pg: &ProcessGroup, cfg: Config) -> Result<Outcome, BoxError> {
    let (rank, world) = (pg.rank(), pg.size());
    let data = Shard::new(cfg.seed, cfg.samples, rank, world);
    // Every rank must take the same number of steps.
    let steps_per_epoch = cfg.samples / (world * cfg.batch);
    if steps_per_epoch == 0 {
        return Err(format!(
            "--samples {} is too few for {} ranks × --batch {}",
            cfg.samples, world, cfg.batch
        )
        .into());
    }
    // As DDP does: each rank initializes its own model, then everyone
    // starts from rank 0's parameters.
    let mut model = Mlp::new(cfg.hidden, cfg.seed.wrapping_add(1000 + rank as u64));
    model.params = pg.broadcast(std::mem::take(&mut model.params), 0)?.await?;
    let h = cfg.hidden;
    let n_params = model.params.len();
    let mut buckets = make_buckets(h, cfg.buckets);
    let mut gpu = pick_gpu(pg, cfg.device, &buckets).await?;
    if rank == 0 {
        println!(
            "async trainer: {world} ranks, buckets on {}, MLP {FEATURES}-{h}-1 ({n_params} params, {} buckets{}), {} samples, batch {}/rank, {} steps/epoch",
            if gpu.is_some() { "GPU (nccl)" } else { "host (tcp)" },
            cfg.buckets,
            if cfg.sequential { ", sequential" } else { ", overlapped" },
            cfg.samples,
            cfg.batch,
            steps_per_epoch,
        );
    }

    let eval = |model: &Mlp| {
        let sse = model.sse(&data);
        let n = data.len() as f64;
        async move {
            let v = pg.all_reduce(vec![sse, n], ReduceOp::Sum)?.await?;
            Ok::<f64, BoxError>(v[0] / v[1].max(1.0))
        }
    };
    let initial = eval(&model).await?;
    if rank == 0 {
        println!(
            "epoch  0/{:<2} {}  eval loss {initial:.4}",
            cfg.epochs,
            bar(0, cfg.epochs, 20)
        );
    }

    let mut grads = vec![0.0f32; n_params];
    let mut velocity = vec![0.0f32; n_params];
    let mut acts = vec![0.0f32; cfg.batch * h];
    let mut g = vec![0.0f32; cfg.batch];
    let mut dz = vec![0.0f32; cfg.batch];
    let mut order: Vec<usize> = (0..data.len()).collect();
    let mut shuffle = StdRng::seed_from_u64(cfg.seed ^ ((rank as u64) << 32));
    let mut pending: Vec<StepTimes> = Vec::new();
    let mut overlap = Overlap::default();
    // The hash check of step s is awaited after step s+1 (it overlaps it).
    let mut hash_check: Option<(usize, HashGather)> = None;
    let mut checks = 0usize;
    let mut step = 0usize;
    let mut last = initial;

    for epoch in 1..=cfg.epochs {
        let t_epoch = Instant::now();
        order.shuffle(&mut shuffle);
        let mut train_sse = 0.0f64;
        for b in 0..steps_per_epoch {
            let idx = &order[b * cfg.batch..(b + 1) * cfg.batch];
            let start_us = now_us();
            let t_start = Instant::now();

            // Forward: activations and dLoss/dy of each sample (MSE).
            for (s, &i) in idx.iter().enumerate() {
                let y = model.predict(data.x(i), &mut acts[s * h..(s + 1) * h]);
                let err = y - data.y[i];
                train_sse += (err * err) as f64;
                g[s] = 2.0 * err / cfg.batch as f32;
            }

            // Backward, output layer first, then hidden unit by unit; a
            // bucket's all_reduce is submitted the moment it is complete.
            for j in 0..h {
                grads[j] = (0..cfg.batch).map(|s| g[s] * acts[s * h + j]).sum();
            }
            grads[h] = g.iter().sum();
            let mut works: Vec<BucketWork> = Vec::with_capacity(buckets.len());
            let mut next = 0;
            for j in 0..h {
                let w2 = model.params[j];
                for s in 0..cfg.batch {
                    let a = acts[s * h + j];
                    dz[s] = g[s] * w2 * (1.0 - a * a);
                }
                let o = model.unit(j);
                let row = &mut grads[o..o + ROW];
                row.fill(0.0);
                for (s, &i) in idx.iter().enumerate() {
                    let d = dz[s];
                    for (gw, &xv) in row[..FEATURES].iter_mut().zip(data.x(i)) {
                        *gw += d * xv;
                    }
                    row[FEATURES] += d;
                }
                if !cfg.sequential && j == buckets[next].last_unit {
                    works.push(submit(pg, next, &mut buckets[next], &mut gpu, &grads)?);
                    next += 1;
                }
            }
            let backward_end_us = now_us();
            let t_backward = Instant::now();
            if cfg.sequential {
                works = submit_all(pg, &mut buckets, &mut gpu, &grads)?;
            }
            let seqs = works.iter().map(|w| w.seq()).collect();

            // Every bucket must be in before the step.
            for (bk, w) in buckets.iter_mut().zip(works) {
                w.finish(bk, &mut gpu, &mut grads).await?;
            }
            overlap.waited += t_backward.elapsed().as_secs_f64() * 1e6;
            overlap.compute += (t_backward - t_start).as_secs_f64() * 1e6;
            pending.push(StepTimes {
                start_us,
                backward_end_us,
                seqs,
            });

            // SGD with momentum.
            for ((p, v), gr) in model.params.iter_mut().zip(&mut velocity).zip(&grads) {
                *v = cfg.momentum * *v + gr;
                *p -= cfg.lr * *v;
            }
            step += 1;
            if cfg.inject_divergence == Some(step) && rank + 1 == world && world > 1 {
                model.params[0] = f32::from_bits(model.params[0].to_bits() ^ 1);
            }

            // Bit-identical parameters: every rank's hash of this step,
            // gathered now and checked after the next step.
            if let Some((s, w)) = hash_check.take() {
                check_hashes(s, w.await?.1)?;
                checks += 1;
            }
            let mine = model.hash() as i64;
            hash_check = Some((step, pg.all_gather(vec![mine], vec![0; world])?));
            overlap.steps += t_start.elapsed().as_secs_f64() * 1e6;

            if pending.len() * (cfg.buckets + 1) >= 500 {
                account(pg, &mut pending, &mut overlap);
            }
        }
        let train = pg
            .all_reduce(
                vec![train_sse, (steps_per_epoch * cfg.batch) as f64],
                ReduceOp::Sum,
            )?
            .await?;
        last = eval(&model).await?;
        if rank == 0 {
            println!(
                "epoch {epoch:>2}/{:<2} {}  train loss {:.4}  eval loss {last:.4}  ({:.2} s)",
                cfg.epochs,
                bar(epoch, cfg.epochs, 20),
                train[0] / train[1],
                t_epoch.elapsed().as_secs_f64()
            );
        }
    }
    if let Some((s, w)) = hash_check.take() {
        check_hashes(s, w.await?.1)?;
        checks += 1;
    }
    account(pg, &mut pending, &mut overlap);

    // Full bitwise check at the end: min and max of every parameter's bits.
    let bits: Vec<i32> = model.params.iter().map(|p| p.to_bits() as i32).collect();
    let lo = pg.all_reduce(bits.clone(), ReduceOp::Min)?;
    let hi = pg.all_reduce(bits, ReduceOp::Max)?;
    let (lo, hi) = (lo.await?, hi.await?);
    let differing = lo.iter().zip(&hi).filter(|(a, b)| a != b).count();

    let sums = pg
        .all_reduce(
            vec![
                overlap.comm_busy,
                overlap.hidden,
                overlap.waited,
                overlap.compute,
                overlap.steps,
            ],
            ReduceOp::Avg,
        )?
        .await?;
    let fell = last < initial / 2.0;
    if rank == 0 {
        print_verdict(initial, last, fell, differing, world, checks, n_params);
        let per = |v: f64| v / 1e3 / step.max(1) as f64;
        let (busy, hidden, waited, compute, wall) = (
            per(sums[0]),
            per(sums[1]),
            per(sums[2]),
            per(sums[3]),
            per(sums[4]),
        );
        println!(
            "per step (mean over ranks): forward+backward {compute:.3} ms; bucket all_reduces busy {busy:.3} ms, {hidden:.3} ms of it ({:.0}%) hidden behind backward; optimizer waited {waited:.3} ms; step {wall:.3} ms",
            100.0 * hidden / busy.max(1e-12),
        );
    }
    Ok(Outcome {
        ok: fell && differing == 0,
    })
}

/// Copies bucket `k`'s slice of the gradient into its buffer: host, or
/// device (an upload on the rank's stream, which the op waits for).
fn fill(
    k: usize,
    bk: &mut Bucket,
    gpu: &mut Option<Gpu>,
    grads: &[f32],
) -> Result<Filled, BoxError> {
    let part = &grads[bk.range.clone()];
    if let Some(gpu) = gpu {
        let mut db = gpu.bufs[k]
            .take()
            .ok_or("a bucket's device buffer is in use")?;
        gpu.stream.copy_htod(part, db.slice_mut())?;
        return Ok(Filled::Device(db));
    }
    let mut buf = std::mem::take(&mut bk.buf);
    buf.clear();
    buf.extend_from_slice(part);
    Ok(Filled::Host(buf))
}

/// A bucket's buffer, filled.
enum Filled {
    Host(Vec<f32>),
    Device(DeviceBuffer<f32>),
}

/// Submits bucket `k`'s all_reduce at once.
fn submit(
    pg: &ProcessGroup,
    k: usize,
    bk: &mut Bucket,
    gpu: &mut Option<Gpu>,
    grads: &[f32],
) -> Result<BucketWork, BoxError> {
    Ok(match fill(k, bk, gpu, grads)? {
        Filled::Host(b) => BucketWork::Host(pg.all_reduce(b, ReduceOp::Avg)?),
        Filled::Device(b) => BucketWork::Device(k, pg.all_reduce(b, ReduceOp::Avg)?),
    })
}

/// Submits every bucket's all_reduce as one group (one fused all_reduce on
/// the TCP backend, one NCCL launch on the GPU).
fn submit_all(
    pg: &ProcessGroup,
    buckets: &mut [Bucket],
    gpu: &mut Option<Gpu>,
    grads: &[f32],
) -> Result<Vec<BucketWork>, BoxError> {
    enum Staged {
        Host(chorus::Batched<Work<Vec<f32>>>),
        Device(usize, chorus::Batched<DeviceWork<DeviceBuffer<f32>>>),
    }
    let staged = {
        let mut g = pg.batch();
        let mut staged = Vec::with_capacity(buckets.len());
        for (k, bk) in buckets.iter_mut().enumerate() {
            staged.push(match fill(k, bk, gpu, grads)? {
                Filled::Host(b) => Staged::Host(g.all_reduce(b, ReduceOp::Avg)?),
                Filled::Device(b) => Staged::Device(k, g.all_reduce(b, ReduceOp::Avg)?),
            });
        }
        g.launch()?;
        staged
    };
    staged
        .into_iter()
        .map(|s| {
            Ok(match s {
                Staged::Host(w) => BucketWork::Host(w.into_work()?),
                Staged::Device(k, w) => BucketWork::Device(k, w.into_work()?),
            })
        })
        .collect()
}

fn check_hashes(step: usize, hashes: Vec<i64>) -> Result<(), BoxError> {
    if hashes.iter().all(|&v| v == hashes[0]) {
        return Ok(());
    }
    let list: Vec<String> = hashes
        .iter()
        .map(|v| format!("{:016x}", *v as u64))
        .collect();
    Err(format!(
        "PARAMETERS DIVERGED after step {step}: hashes by rank [{}]",
        list.join(", ")
    )
    .into())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let cfg = match Config::from_args(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("async_trainer: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.fault_tolerant {
        return fault_tolerant_main(&args, cfg);
    }
    if let Some(code) = launch_self_if_needed(args.nproc) {
        return code;
    }
    let result = run_rank(Duration::from_secs(60), |pg| async move {
        train(&pg, cfg).await
    });
    match result {
        Ok(o) if o.ok => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("async_trainer failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--fault-tolerant`: launches its ranks with restarts if no launcher did,
/// and trains until the end on whatever group is left.
fn fault_tolerant_main(args: &Args, cfg: Config) -> ExitCode {
    if cfg.device == DeviceArg::Cuda {
        eprintln!("async_trainer: --fault-tolerant runs on host buffers (--device cpu)");
        return ExitCode::FAILURE;
    }
    let kills = match fault_tolerant::parse_kills(&args.kill) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("async_trainer: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.admit_every == 0 {
        eprintln!("async_trainer: --admit-every must be at least 1");
        return ExitCode::FAILURE;
    }
    if let Some(code) = launch_self_restarting_if_needed(args.nproc, args.max_restarts) {
        return code;
    }
    let ft = fault_tolerant::FaultConfig {
        admit_every: args.admit_every,
        window: Duration::from_millis(args.reform_window_ms),
        kills,
    };
    let run = || -> Result<bool, BoxError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let pg = ProcessGroup::builder()
                .timeout(Duration::from_secs(60))
                .init_from_env()
                .await?;
            let (last, ok) = fault_tolerant::train(pg, cfg, ft).await?;
            last.shutdown().await?;
            Ok(ok)
        })
    };
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("async_trainer failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Prints the run's verdict lines: whether the loss fell below half, and
/// whether the parameters stayed bit-identical on all `world` ranks
/// (`differing` of `n` differ at the end, `checks` steps hashed).
fn print_verdict(
    initial: f64,
    last: f64,
    fell: bool,
    differing: usize,
    world: usize,
    checks: usize,
    n: usize,
) {
    println!(
        "loss fell from {initial:.4} to {last:.4} ({:.1}x lower): {}",
        initial / last,
        if fell {
            "OK"
        } else {
            "FAIL (expected below half)"
        }
    );
    if differing == 0 {
        println!(
            "parameters bit-identical on all {world} ranks after each of {checks} steps (64-bit hash all_gathered every step; all {n} parameters compared bitwise at the end): OK"
        );
    } else {
        println!(
            "PARAMETERS DIFFER across ranks at the end: {differing} of {n} differ bitwise: FAIL"
        );
    }
}
