//! The training loop: steps, bucket submission, stream-ordered waits,
//! printing, the checks and the measurements.

use std::path::PathBuf;
use std::time::Instant;

use chorus::{DType, Device, ProcessGroup, RawDeviceBuffer, ReduceOp, StreamPriority};

use super::data::{init_params, Batches};
use super::error::TrainError;
use super::layout::{buckets, Layout};
use super::model::GpuMlp;
use super::reference::CpuMlp;
use super::timing::{median, Spans, StepProfile, TimedEvent};

/// What to train and how.
#[derive(Clone, Debug)]
pub struct Config {
    /// Units of every layer (inputs = outputs = width).
    pub width: usize,
    /// Linear layers.
    pub layers: usize,
    /// Samples per step on each rank.
    pub batch: usize,
    /// Optimizer steps.
    pub steps: usize,
    /// Gradient bucket cap in MiB (PyTorch DDP's `bucket_cap_mb`).
    pub bucket_mib: f64,
    /// Learning rate of plain SGD.
    pub lr: f32,
    /// Seed of the parameters and the data.
    pub seed: u64,
    /// Batches in each rank's data set (one epoch).
    pub data_batches: usize,
    /// Print (and check the hashes) every this many steps; 0: at the end.
    pub print_every: usize,
    /// Steps whose loss is compared with the CPU reference (0: none).
    pub check_steps: usize,
    /// Relative tolerance of that comparison.
    pub check_tol: f64,
    /// Steps (at the end of the run) timed kernel by kernel.
    pub profile_steps: usize,
    /// Where to write the Chrome trace of one profiled step.
    pub profile: Option<PathBuf>,
    /// The GPU of this rank.
    pub device: usize,
}

/// What a run measured and checked (rank 0's view; figures averaged over
/// ranks where they differ).
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Loss of every step (mean over ranks).
    pub losses: Vec<f64>,
    /// The CPU reference's losses of the first `check_steps` steps.
    pub reference: Vec<f64>,
    /// Largest relative difference between the two.
    pub reference_err: f64,
    /// Every checked loss within tolerance (true when nothing was checked).
    pub reference_ok: bool,
    /// Steps whose parameter hashes were compared across ranks.
    pub hashes_checked: usize,
    /// Mean loss of the last quarter of steps below 0.95 × the first
    /// quarter's.
    pub loss_fell: bool,
    /// Gradient buckets.
    pub buckets: usize,
    /// Median GPU time per step (step start to the next step's start), ms.
    pub step_ms: f64,
    /// Host CPU time (user + system, all threads) per step, ms.
    pub host_cpu_ms: f64,
    /// Host wall time per step over the timed steps, ms.
    pub host_wall_ms: f64,
    /// Median compute-stream idle time per profiled step, ms.
    pub gpu_idle_ms: f64,
    /// Median all_reduce time not hidden behind compute, ms.
    pub exposed_comm_ms: f64,
    /// Median time the last all_reduce ended after backward, ms.
    pub comm_after_backward_ms: f64,
    /// Samples per second over all ranks.
    pub samples_per_s: f64,
}

/// The CPU reference's losses for the first `steps` steps of `cfg` on
/// `world` ranks.
pub fn reference_losses(cfg: &Config, world: usize, steps: usize) -> Vec<f64> {
    let layout = Layout {
        layers: cfg.layers,
        width: cfg.width,
    };
    let mut m = CpuMlp {
        layout,
        params: init_params(&layout, cfg.seed),
    };
    let data: Vec<Batches> = (0..world)
        .map(|r| Batches::new(cfg.seed, r, cfg.data_batches, cfg.batch, cfg.width))
        .collect();
    (0..steps)
        .map(|s| {
            let b: Vec<(&[f32], &[f32])> =
                data.iter().map(|d| d.get(s % cfg.data_batches)).collect();
            m.step(&b, cfg.lr)
        })
        .collect()
}

fn cpu_time() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_SELF)
        .map(|u| {
            let t = |v: nix::sys::time::TimeVal| v.tv_sec() as f64 + v.tv_usec() as f64 * 1e-6;
            t(u.user_time()) + t(u.system_time())
        })
        .unwrap_or(0.0)
}

fn bar(done: usize, total: usize) -> String {
    let filled = done * 20 / total.max(1);
    format!("[{}{}]", "#".repeat(filled), "-".repeat(20 - filled))
}

/// Trains `cfg` on this rank's GPU with `pg` (every rank calls it).
///
/// # Errors
///
/// A [`TrainError`] naming the failed CUDA, cuBLAS or collective call, or
/// diverged parameters.
#[allow(clippy::needless_range_loop)] // `s` is the step, not just an index
pub async fn train(pg: &ProcessGroup, cfg: &Config) -> Result<Report, TrainError> {
    let (rank, world) = (pg.rank(), pg.size());
    if cfg.width == 0
        || cfg.layers == 0
        || cfg.batch == 0
        || cfg.steps == 0
        || cfg.data_batches == 0
    {
        return Err(TrainError::Config(
            "--width, --layers, --batch, --steps and --data-batches must be at least 1".into(),
        ));
    }
    let coll = |op: &str, step: usize, e: &dyn std::fmt::Display| {
        TrainError::collective(rank, op, step, e)
    };
    let layout = Layout {
        layers: cfg.layers,
        width: cfg.width,
    };
    let cap = (cfg.bucket_mib * (1 << 20) as f64).max(1.0) as usize;
    let bks = buckets(&layout, cap, 4);
    let check = cfg.check_steps.min(cfg.steps);
    // The reference first, on rank 0, before anything is timed.
    let reference = if rank == 0 && check > 0 {
        let t = Instant::now();
        let r = reference_losses(cfg, world, check);
        println!(
            "gpu trainer: CPU reference of {check} step(s) on {world} rank(s)' data in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        r
    } else {
        Vec::new()
    };

    let cuda = |source| TrainError::Cuda { rank, source };
    let dev = Device::get(cfg.device).map_err(cuda)?;
    let compute = dev.new_stream(StreamPriority::Normal).map_err(cuda)?;
    let observer = dev.new_stream(StreamPriority::Normal).map_err(cuda)?;
    pg.init_device(cfg.device)
        .await
        .map_err(|e| coll("init_device", 0, &e))?;
    let data = Batches::new(cfg.seed, rank, cfg.data_batches, cfg.batch, cfg.width);
    let params = init_params(&layout, cfg.seed);
    let mut model = GpuMlp::new(compute.clone(), rank, layout, &params, &data, cfg.steps)?;
    drop(params);
    let bucket_ptrs: Vec<u64> = bks.iter().map(|b| model.grad_ptr(b.range.start)).collect();
    if rank == 0 {
        println!(
            "gpu trainer: {world} rank(s), MLP {} x {} ({} params, {:.1} MiB), batch {}/rank, {} bucket(s) (cap {} MiB), SGD lr {}, {} steps, device {}",
            cfg.layers,
            cfg.width,
            layout.total(),
            layout.total() as f64 * 4.0 / (1 << 20) as f64,
            cfg.batch,
            bks.len(),
            cfg.bucket_mib,
            cfg.lr,
            cfg.steps,
            dev.name().unwrap_or_default()
        );
    }
    let starts: Vec<TimedEvent> = (0..=cfg.steps)
        .map(|_| TimedEvent::new(rank))
        .collect::<Result<_, _>>()?;
    let prof_from = cfg.steps - cfg.profile_steps.min(cfg.steps / 2);
    let warm = (cfg.steps / 10)
        .clamp(1, 10)
        .min(prof_from.saturating_sub(1));
    let mut profiles: Vec<(usize, StepProfile)> = Vec::new();
    let (mut cpu0, mut wall0) = (cpu_time(), Instant::now());
    let (mut cpu_timed, mut wall_timed) = (0.0, 0.0);
    let mut losses: Vec<f64> = Vec::with_capacity(cfg.steps);
    let mut checked = 0usize;
    let print_every = if cfg.print_every == 0 {
        cfg.steps
    } else {
        cfg.print_every
    };
    let epoch_len = cfg.data_batches;
    let mut last_print = Instant::now();

    for s in 0..cfg.steps {
        if s == warm {
            (cpu0, wall0) = (cpu_time(), Instant::now());
        }
        if s == prof_from {
            cpu_timed = cpu_time() - cpu0;
            wall_timed = wall0.elapsed().as_secs_f64();
        }
        let b = s % cfg.data_batches;
        starts[s].record(&compute, rank)?;
        let mut prof = (s >= prof_from).then(StepProfile::default);
        let mut p = prof.as_mut();
        model.forward(s, b, &mut p)?;
        let mut works = Vec::with_capacity(bks.len());
        let mut next = 0;
        model.backward(b, &mut p, |l, p| {
            while next < bks.len() && bks[next].last_layer == l {
                if let Some(p) = p {
                    let ev = TimedEvent::new(rank)?;
                    ev.record(&compute, rank)?;
                    p.ready.push(ev);
                }
                // SAFETY: the bucket is a range of the model's gradient
                // buffer, which lives until the end of `train`, after the
                // stream has finished every op (the final read-back
                // synchronizes the compute stream, which waits on every
                // op's end event); it is written only on `compute`, in
                // stream order with the op.
                let buf = unsafe {
                    RawDeviceBuffer::new(
                        bucket_ptrs[next],
                        bks[next].range.len(),
                        DType::F32,
                        compute.clone(),
                    )
                };
                let op = format!("all_reduce(bucket {next})");
                works.push(
                    pg.all_reduce(buf, ReduceOp::Avg)
                        .map_err(|e| coll(&op, s, &e))?,
                );
                next += 1;
            }
            Ok(())
        })?;
        if let Some(p) = p.as_mut() {
            p.backward_last = p.kernels.len().saturating_sub(1);
        }
        for (k, w) in works.into_iter().enumerate() {
            if let Some(p) = p.as_mut() {
                observer.wait_event(w.end_event()).map_err(cuda)?;
                let ev = TimedEvent::new(rank)?;
                ev.record(&observer, rank)?;
                p.comm_end.push(ev);
            }
            // StreamOrdered: the compute stream waits on the op's end
            // event; the host goes on at once.
            let op = format!("all_reduce(bucket {k}) stream_ordered");
            w.stream_ordered_on(&compute)
                .map_err(|e| coll(&op, s, &e))?;
            model.sgd(bks[k].range.clone(), cfg.lr, &mut p)?;
        }
        model.hash(s, &mut p)?;
        if let Some(pr) = prof {
            profiles.push((s, pr));
        }

        let done = s + 1;
        if done % print_every == 0 || done == cfg.steps {
            // The only host waits: the losses and hashes of the steps since
            // the last print.
            let (l, h) = model.read_back(losses.len(), done)?;
            let mean = pg
                .all_reduce(l, ReduceOp::Avg)
                .map_err(|e| coll("all_reduce(losses)", s, &e))?
                .await
                .map_err(|e| coll("all_reduce(losses)", s, &e))?;
            let mine: Vec<i64> = h.iter().map(|&v| v as i64).collect();
            let n = mine.len();
            let (_, all) = pg
                .all_gather(mine, vec![0i64; n * world])
                .map_err(|e| coll("all_gather(hashes)", s, &e))?
                .await
                .map_err(|e| coll("all_gather(hashes)", s, &e))?;
            for i in 0..n {
                let by_rank: Vec<i64> = (0..world).map(|r| all[r * n + i]).collect();
                if by_rank.iter().any(|&v| v != by_rank[0]) {
                    return Err(TrainError::Diverged {
                        step: losses.len() + i + 1,
                        hashes: by_rank
                            .iter()
                            .map(|v| format!("{:016x}", *v as u64))
                            .collect::<Vec<_>>()
                            .join(", "),
                    });
                }
            }
            checked += n;
            let k = mean.len();
            losses.extend(mean);
            let secs = last_print.elapsed().as_secs_f64();
            last_print = Instant::now();
            if rank == 0 {
                let epochs = cfg.steps.div_ceil(epoch_len);
                let epoch = (done - 1) / epoch_len + 1;
                let in_epoch = done - (epoch - 1) * epoch_len;
                println!(
                    "epoch {epoch:>3}/{epochs:<3} {} step {done:>5}/{}  loss {:.6}  {:.0} samples/s",
                    bar(in_epoch, epoch_len.min(cfg.steps)),
                    cfg.steps,
                    losses[losses.len() - 1],
                    (k * cfg.batch * world) as f64 / secs.max(1e-9),
                );
            }
        }
    }
    if prof_from >= cfg.steps {
        cpu_timed = cpu_time() - cpu0;
        wall_timed = wall0.elapsed().as_secs_f64();
    }
    starts[cfg.steps].record(&compute, rank)?;
    compute.synchronize().map_err(cuda)?;
    observer.synchronize().map_err(cuda)?;

    // Measurements.
    let step_us: Vec<f64> = (warm..cfg.steps)
        .map(|s| starts[s + 1].since(&starts[s], rank))
        .collect::<Result<_, _>>()?;
    let mut spans = Vec::new();
    for (s, p) in &profiles {
        spans.push((*s, Spans::harvest(p, &starts[*s], &starts[s + 1], rank)?));
    }
    let timed_steps = (prof_from.min(cfg.steps) - warm).max(1) as f64;
    let med = |f: &dyn Fn(&Spans) -> f64| {
        median(&spans.iter().map(|(_, sp)| f(sp)).collect::<Vec<_>>()) / 1e3
    };
    let mine = vec![
        median(&step_us) / 1e3,
        cpu_timed * 1e3 / timed_steps,
        wall_timed * 1e3 / timed_steps,
        med(&|s| s.gpu_idle()),
        med(&|s| s.exposed_comm()),
        med(&|s| s.comm_after_backward()),
    ];
    let avg = pg
        .all_reduce(mine, ReduceOp::Avg)
        .map_err(|e| coll("all_reduce(figures)", cfg.steps, &e))?
        .await
        .map_err(|e| coll("all_reduce(figures)", cfg.steps, &e))?;
    if let (Some(path), Some((s, sp))) = (&cfg.profile, spans.last()) {
        let events = sp.chrome_trace(rank, *s);
        let path = if world > 1 {
            PathBuf::from(format!("{}.rank{rank}", path.display()))
        } else {
            path.clone()
        };
        let text =
            serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ms" }).to_string();
        std::fs::write(&path, text).map_err(|source| TrainError::Profile {
            path: path.display().to_string(),
            source,
        })?;
        if rank == 0 {
            println!("profile of step {s} written to {}", path.display());
        }
    }

    let mut reference_err = 0.0f64;
    for (g, r) in losses.iter().zip(&reference) {
        reference_err = reference_err.max((g - r).abs() / r.abs().max(1e-12));
    }
    let q = (losses.len() / 4).max(1);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let loss_fell =
        losses.len() >= 4 && mean(&losses[losses.len() - q..]) < 0.95 * mean(&losses[..q]);
    Ok(Report {
        reference_ok: reference_err <= cfg.check_tol,
        reference_err,
        reference,
        hashes_checked: checked,
        loss_fell,
        buckets: bks.len(),
        step_ms: avg[0],
        host_cpu_ms: avg[1],
        host_wall_ms: avg[2],
        gpu_idle_ms: avg[3],
        exposed_comm_ms: avg[4],
        comm_after_backward_ms: avg[5],
        samples_per_s: (cfg.batch * world) as f64 / (avg[0] / 1e3).max(1e-12),
        losses,
    })
}
