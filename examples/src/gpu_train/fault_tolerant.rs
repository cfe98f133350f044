//! `gpu_trainer --fault-tolerant`: the same model, data and update on the
//! GPU, in steps that survive lost ranks (the NCCL counterpart of
//! `async_trainer --fault-tolerant`).
//!
//! Each step runs forward and backward, all_reduces the gradient buckets
//! (Avg) as backward produces them, and **awaits every bucket before the
//! optimizer**: a step whose collectives fail is abandoned with the
//! parameters untouched. Every rank, replacements included, runs one loop
//! with [`ProcessGroup::admit`] at the top of a step (every
//! `--admit-every` steps, and right after a failure or a start): it
//! re-forms a failed group, lets in a rank that `chorus-run
//! --max-restarts` restarted, and returns a replacement's group on its
//! first call. Whenever a member finds itself in a group it has not
//! synchronized on (the first group, a re-formed or grown one, the group a
//! replacement rejoined), it takes rank 0's parameters (over NCCL) and
//! step (over the host) before its next step: the same ops on every member
//! of the group, survivors and replacement alike.
//!
//! Each rank trains on the data of its world rank, whatever its rank in
//! the current group. After every step the parameters' hash (computed on
//! the GPU) is compared across the group's ranks: bit-identical or the
//! run fails. The first `--check-steps` losses (before any failure) are
//! compared with the CPU reference.

use std::time::{Duration, Instant};

use chorus::{DType, Device, ProcessGroup, RawDeviceBuffer, ReduceOp, StreamPriority};

use super::data::{init_params, Batches};
use super::error::TrainError;
use super::layout::{buckets, Layout};
use super::model::GpuMlp;
use super::train::{reference_losses, Config};

/// The fault-tolerant run's own settings.
#[derive(Clone, Debug)]
pub struct FaultConfig {
    /// Members call `admit` every this many steps.
    pub admit_every: usize,
    /// The re-form window.
    pub window: Duration,
    /// `(world rank, step)`: that rank SIGKILLs itself in that step, after
    /// submitting its buckets (first start only).
    pub kills: Vec<(usize, usize)>,
}

/// What a fault-tolerant run saw (rank 0's view).
#[derive(Clone, Debug, Default)]
pub struct FaultReport {
    /// The loss of every step made, mean over the group's ranks.
    pub losses: Vec<f64>,
    /// The CPU reference's first losses, and the largest relative
    /// difference from them.
    pub reference: Vec<f64>,
    /// Largest relative difference of the checked losses.
    pub reference_err: f64,
    /// Every checked loss within tolerance.
    pub reference_ok: bool,
    /// The loss fell (last quarter's mean below 0.95 × the first's).
    pub loss_fell: bool,
    /// Steps whose parameter hashes matched on every rank.
    pub hashes_checked: usize,
    /// Steps abandoned because a collective failed.
    pub failures: Vec<(usize, String)>,
    /// (epoch, world size) of every group this rank was in.
    pub groups: Vec<(u64, usize)>,
}

/// Parses `R@S,R@S` (world rank at step).
///
/// # Errors
///
/// A part that is not `RANK@STEP`.
pub fn parse_kills(s: &str) -> Result<Vec<(usize, usize)>, String> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (r, st) = p
                .split_once('@')
                .ok_or_else(|| format!("--kill {p}: expected RANK@STEP"))?;
            Ok((
                r.parse().map_err(|_| format!("--kill {p}: bad rank"))?,
                st.parse().map_err(|_| format!("--kill {p}: bad step"))?,
            ))
        })
        .collect()
}

/// Trains `cfg` with the job's group `pg`, surviving lost ranks; returns
/// the last group (to shut down) and the report.
///
/// # Errors
///
/// A CUDA or cuBLAS failure, parameters that diverged across ranks, or a
/// re-form or admit that failed.
pub async fn train_fault_tolerant(
    mut pg: ProcessGroup,
    cfg: &Config,
    ft: &FaultConfig,
) -> Result<(ProcessGroup, FaultReport), TrainError> {
    let me = pg.members()[pg.rank()];
    let restarted = std::env::var("CHORUS_RANK_RESTARTS").is_ok_and(|v| v.trim() != "0");
    let job_world = pg.size();
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
    let layout = Layout {
        layers: cfg.layers,
        width: cfg.width,
    };
    let cap = (cfg.bucket_mib * (1 << 20) as f64).max(1.0) as usize;
    let bks = buckets(&layout, cap, 4);
    let check = cfg.check_steps.min(cfg.steps);
    let mut rep = FaultReport {
        reference_ok: true,
        ..FaultReport::default()
    };
    if pg.rank() == 0 && !restarted && check > 0 {
        rep.reference = reference_losses(cfg, job_world, check);
    }
    let cuda = |source| TrainError::Cuda { rank: me, source };
    let dev = Device::get(cfg.device).map_err(cuda)?;
    let compute = dev.new_stream(StreamPriority::Normal).map_err(cuda)?;
    let data = Batches::new(cfg.seed, me, cfg.data_batches, cfg.batch, cfg.width);
    let mut model = GpuMlp::new(
        compute.clone(),
        me,
        layout,
        &init_params(&layout, cfg.seed),
        &data,
        cfg.steps,
    )?;
    let bucket_ptrs: Vec<u64> = bks.iter().map(|b| model.grad_ptr(b.range.start)).collect();
    let params = model.params_ptr();
    if pg.rank() == 0 {
        println!(
            "gpu trainer (fault-tolerant): {} rank(s), MLP {} x {} ({} params), batch {}/rank, {} bucket(s), {} steps, admit every {} step(s)",
            pg.size(),
            cfg.layers,
            cfg.width,
            layout.total(),
            cfg.batch,
            bks.len(),
            cfg.steps,
            ft.admit_every
        );
    }
    let params_buf = || {
        // SAFETY: the parameter vector (and below, the gradient buckets)
        // are ranges of the model's buffers, which live until the end of
        // this function, after every op on them has ended (each op is
        // awaited, or its group aborted, before the next step); they are
        // written only on `compute`, in stream order with the ops.
        unsafe { RawDeviceBuffer::new(params, layout.total(), DType::F32, compute.clone()) }
    };
    let mut step = 0usize;
    let mut synced: Option<u64> = None;
    let mut last_print = Instant::now();
    // `admit` at the top of a step, every `admit_every` steps and right
    // after a failure or a start (a replacement's group waits for it; on a
    // failed group it re-forms); in a group this rank has not synced on —
    // the first group, a re-formed or grown one, the one a replacement
    // rejoined — every member then takes rank 0's state.
    let mut due = true;
    loop {
        if due || (ft.admit_every > 0 && step % ft.admit_every == 0) {
            due = false;
            match pg.admit(ft.window).await {
                Ok(Some(g)) => pg = g,
                Ok(None) => {}
                // A joiner counted in died before connecting: the next
                // admit forms the epoch after without it.
                Err(chorus::ReformError::Connect { .. }) => {
                    due = true;
                    continue;
                }
                Err(e) => return Err(TrainError::collective(me, "admit", step, e)),
            }
        }
        if synced != Some(pg.epoch()) {
            rep.groups.push((pg.epoch(), pg.size()));
            match sync(&pg, params_buf(), &mut step).await {
                Ok(()) => synced = Some(pg.epoch()),
                Err(e) => {
                    println!("rank {me}: taking rank 0's state failed ({e}); re-forming");
                    due = true;
                    continue;
                }
            }
        }
        if step >= cfg.steps {
            break;
        }
        let b = step % cfg.data_batches;
        model.forward(step, b, &mut None)?;
        let mut works = Vec::with_capacity(bks.len());
        let mut next = 0;
        let mut refused = None;
        model.backward(b, &mut None, |l, _| {
            while next < bks.len() && bks[next].last_layer == l {
                // SAFETY: as for `params_buf` above: a range of the
                // model's gradient buffer.
                let buf = unsafe {
                    RawDeviceBuffer::new(
                        bucket_ptrs[next],
                        bks[next].range.len(),
                        DType::F32,
                        compute.clone(),
                    )
                };
                match pg.all_reduce(buf, ReduceOp::Avg) {
                    Ok(w) => works.push(w),
                    Err(r) => {
                        refused.get_or_insert_with(|| r.error.to_string());
                    }
                }
                next += 1;
            }
            Ok(())
        })?;
        if ft.kills.contains(&(me, step)) && !restarted {
            std::thread::sleep(Duration::from_millis(1));
            println!("rank {me}: killing itself in step {step} (--kill)");
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
        // Every bucket ends before the optimizer touches a parameter.
        let mut failed = refused;
        for w in works {
            if let Err(f) = w.await {
                failed = failed.or(Some(f.error().to_string()));
            }
        }
        let checked = match failed {
            None => {
                for bk in &bks {
                    model.sgd(bk.range.clone(), cfg.lr, &mut None)?;
                }
                model.hash(step, &mut None)?;
                check_step(&pg, &model, step).await
            }
            Some(e) => Err(TrainStep::Failed(e)),
        };
        match checked {
            Ok(loss) => {
                rep.hashes_checked += 1;
                rep.losses.truncate(step);
                rep.losses.push(loss);
                step += 1;
                if pg.rank() == 0
                    && (step == cfg.steps || (cfg.print_every > 0 && step % cfg.print_every == 0))
                {
                    println!(
                        "step {step:>5}/{}  loss {loss:.6}  {} rank(s), group epoch {}  ({:.1} steps/s)",
                        cfg.steps,
                        pg.size(),
                        pg.epoch(),
                        cfg.print_every.max(1) as f64 / last_print.elapsed().as_secs_f64().max(1e-9)
                    );
                    last_print = Instant::now();
                }
            }
            Err(TrainStep::Diverged(e)) => return Err(e),
            Err(TrainStep::Failed(e)) => {
                println!("rank {me}: step {step} failed ({e}); re-forming");
                rep.failures.push((step, e));
                due = true;
            }
        }
    }
    compute.synchronize().map_err(cuda)?;
    for (k, (g, r)) in rep.losses.iter().zip(&rep.reference).enumerate() {
        let err = (g - r).abs() / r.abs().max(1e-12);
        // Only the steps before the first failure ran on the reference's
        // world.
        if rep.failures.first().is_none_or(|f| k < f.0) {
            rep.reference_err = rep.reference_err.max(err);
        }
    }
    rep.reference_ok = rep.reference_err <= cfg.check_tol;
    let q = (rep.losses.len() / 4).max(1);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    rep.loss_fell = rep.losses.len() >= 4
        && mean(&rep.losses[rep.losses.len() - q..]) < 0.95 * mean(&rep.losses[..q]);
    Ok((pg, rep))
}

/// Why a step did not count.
enum TrainStep {
    /// A collective failed: re-form and redo it.
    Failed(String),
    /// The ranks hold different parameters: stop.
    Diverged(TrainError),
}

impl From<String> for TrainStep {
    fn from(e: String) -> TrainStep {
        TrainStep::Failed(e)
    }
}

/// The step's loss (mean over the group) once every rank's parameter hash
/// after it is the same.
async fn check_step(pg: &ProcessGroup, model: &GpuMlp, step: usize) -> Result<f64, TrainStep> {
    let (l, h) = model
        .read_back(step, step + 1)
        .map_err(TrainStep::Diverged)?;
    let world = pg.size();
    let mean = pg
        .all_reduce(l, ReduceOp::Avg)
        .map_err(|r| r.error.to_string())?
        .await
        .map_err(|f| f.error().to_string())?;
    let mine = vec![h[0] as i64];
    let (_, all) = pg
        .all_gather(mine, vec![0i64; world])
        .map_err(|r| r.error.to_string())?
        .await
        .map_err(|f| f.error().to_string())?;
    if all.iter().any(|&v| v != all[0]) {
        return Err(TrainStep::Diverged(TrainError::Diverged {
            step: step + 1,
            hashes: all
                .iter()
                .map(|v| format!("{:016x}", *v as u64))
                .collect::<Vec<_>>()
                .join(", "),
        }));
    }
    Ok(mean[0])
}

/// Rank 0's parameters (over NCCL, on the compute stream) and step (over
/// the host) to every member of `pg`.
async fn sync(pg: &ProcessGroup, params: RawDeviceBuffer, step: &mut usize) -> Result<(), String> {
    pg.broadcast(params, 0)
        .map_err(|r| r.error.to_string())?
        .await
        .map_err(|f| f.error().to_string())?;
    let s = pg
        .broadcast(vec![*step as u64], 0)
        .map_err(|r| r.error.to_string())?
        .await
        .map_err(|f| f.error().to_string())?;
    *step = s[0] as usize;
    Ok(())
}
