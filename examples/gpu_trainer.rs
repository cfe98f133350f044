//! chorus GPU trainer: data-parallel training of an MLP computed on the
//! GPU, with DDP-style gradient buckets all_reduced by NCCL while backward
//! runs and an optimizer ordered after them on the GPU, not by the host.
//!
//! ```sh
//! cargo build --release -p chorus-examples --example gpu_trainer
//! # one rank per GPU (it launches --nproc ranks of itself when no launcher did)
//! target/release/examples/gpu_trainer --nproc 1 --width 1024 --layers 4
//! chorus-run --nproc-per-node 2 -- target/release/examples/gpu_trainer --width 8192 --batch 128
//! ```
//!
//! Every rank runs forward and backward on a compute stream, in f32
//! throughout (cuBLAS SGEMM without TF32, PTX kernels for bias, ReLU, loss
//! and update). Each gradient bucket's
//! `all_reduce(Avg)` is submitted the moment backward has issued its last
//! gradient; after backward, the compute stream waits on each bucket's end
//! event (the stream-ordered level) and updates that bucket's parameters
//! (plain SGD). The host waits only when it prints.
//!
//! Checked on every run: the first `--check-steps` losses against a CPU
//! reference computed in the same process (rank 0), the parameters' hash
//! (computed on the GPU after every step) equal on every rank, and the
//! loss falling. The last line is a machine-readable summary
//! (`summary {json}`). docs/EXAMPLES.md says what each figure means.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use chorus_examples::gpu_train::{train, train_fault_tolerant, Config, FaultConfig};
use chorus_examples::{launch_self_if_needed, launch_self_restarting_if_needed, run_rank};
use clap::Parser;

#[derive(Parser, Debug, Clone)]
#[command(about = "Data-parallel MLP training on the GPU with stream-ordered gradient buckets")]
struct Args {
    /// Ranks to start when not launched by chorus-run/torchrun/srun.
    #[arg(long, default_value_t = 1)]
    nproc: usize,
    /// Units of every layer.
    #[arg(long, default_value_t = 1024)]
    width: usize,
    /// Linear layers (ReLU between them).
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Samples per step on each rank.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Optimizer steps.
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// Gradient bucket cap in MiB (DDP's bucket_cap_mb).
    #[arg(long, default_value_t = 25.0)]
    bucket_mib: f64,
    /// Learning rate of plain SGD.
    #[arg(long, default_value_t = 6.0)]
    lr: f32,
    /// Seed of parameters and data.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Batches per rank in the data set (one epoch).
    #[arg(long, default_value_t = 8)]
    data_batches: usize,
    /// Print progress every N steps (0: only at the end).
    #[arg(long, default_value_t = 20)]
    print_every: usize,
    /// Steps whose loss must match the CPU reference.
    #[arg(long, default_value_t = 3)]
    check_steps: usize,
    /// Relative tolerance of that match.
    #[arg(long, default_value_t = 5e-4)]
    check_tol: f64,
    /// Steps at the end timed launch by launch (GPU idle, exposed comm).
    #[arg(long, default_value_t = 5)]
    profile_steps: usize,
    /// Write a Chrome trace (chrome://tracing, Perfetto) of one step here.
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Op timeout in seconds.
    #[arg(long, default_value_t = 300)]
    timeout_s: u64,
    /// Train in steps that survive lost ranks: a step whose collectives
    /// fail is redone on the re-formed group, and replacement ranks
    /// (`chorus-run --max-restarts`) are admitted at step boundaries.
    #[arg(long)]
    fault_tolerant: bool,
    /// With --fault-tolerant: members call admit every N steps.
    #[arg(long, default_value_t = 1)]
    admit_every: usize,
    /// With --fault-tolerant: the re-form window in milliseconds.
    #[arg(long, default_value_t = 3000)]
    window_ms: u64,
    /// With --fault-tolerant: that world rank SIGKILLs itself in that step
    /// (first start only), for fault tests; repeat for several.
    #[arg(long, value_name = "RANK@STEP", value_parser = parse_kill)]
    kill: Vec<(usize, usize)>,
    /// When launching itself (--nproc): restart a failed rank up to N times
    /// (`chorus-run --keep-going --max-restarts N`).
    #[arg(long, default_value_t = 0)]
    max_restarts: u32,
}

fn parse_kill(s: &str) -> Result<(usize, usize), String> {
    match chorus_examples::gpu_train::parse_kills(s)?.as_slice() {
        [one] => Ok(*one),
        _ => Err(format!("--kill {s}: expected RANK@STEP")),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let launched = if args.max_restarts > 0 {
        launch_self_restarting_if_needed(args.nproc, args.max_restarts)
    } else {
        launch_self_if_needed(args.nproc)
    };
    if let Some(code) = launched {
        return code;
    }
    let device = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let cfg = Config {
        width: args.width,
        layers: args.layers,
        batch: args.batch,
        steps: args.steps,
        bucket_mib: args.bucket_mib,
        lr: args.lr,
        seed: args.seed,
        data_batches: args.data_batches,
        print_every: args.print_every,
        check_steps: args.check_steps,
        check_tol: args.check_tol,
        profile_steps: args.profile_steps,
        profile: args.profile.clone(),
        device,
    };
    if args.fault_tolerant {
        let ft = FaultConfig {
            admit_every: args.admit_every,
            window: Duration::from_millis(args.window_ms),
            kills: args.kill.clone(),
        };
        return fault_tolerant(&cfg, &ft, Duration::from_secs(args.timeout_s));
    }
    let result = run_rank(Duration::from_secs(args.timeout_s), |pg| async move {
        let rank = pg.rank();
        let world = pg.size();
        let r = train(&pg, &cfg).await?;
        Ok((rank, world, cfg, r))
    });
    let (rank, world, cfg, r) = match result {
        Ok(v) => v,
        Err(e) => {
            eprintln!("gpu_trainer failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let ok = r.reference_ok && r.loss_fell;
    if rank == 0 {
        let shown: Vec<String> = r
            .losses
            .iter()
            .zip(&r.reference)
            .map(|(g, c)| format!("{g:.6} (cpu {c:.6})"))
            .collect();
        println!(
            "losses vs CPU reference, first {} step(s): {}; max relative difference {:.2e} (tolerance {:.0e}): {}",
            r.reference.len(),
            shown.join(", "),
            r.reference_err,
            cfg.check_tol,
            if r.reference_ok { "OK" } else { "FAIL" }
        );
        let (first, last) = (
            r.losses.first().copied().unwrap_or(0.0),
            r.losses.last().copied().unwrap_or(0.0),
        );
        println!(
            "loss fell from {first:.6} to {last:.6} (last quarter's mean below 0.95 x the first quarter's): {}",
            if r.loss_fell { "OK" } else { "FAIL" }
        );
        println!(
            "parameters bit-identical on all {world} rank(s) after each of {} steps (GPU hash all_gathered): OK",
            r.hashes_checked
        );
        println!(
            "per step (mean over ranks): step {:.3} ms (median, GPU); host CPU {:.3} ms; host wall {:.3} ms; GPU idle {:.3} ms; all_reduce exposed {:.3} ms ({:.3} ms after backward's end); {:.0} samples/s",
            r.step_ms, r.host_cpu_ms, r.host_wall_ms, r.gpu_idle_ms, r.exposed_comm_ms, r.comm_after_backward_ms, r.samples_per_s
        );
        let summary = serde_json::json!({
            "impl": "chorus",
            "world": world,
            "width": cfg.width,
            "layers": cfg.layers,
            "batch": cfg.batch,
            "buckets": r.buckets,
            "bucket_mib": cfg.bucket_mib,
            "steps": cfg.steps,
            "step_ms": r.step_ms,
            "host_cpu_ms": r.host_cpu_ms,
            "host_wall_ms": r.host_wall_ms,
            "gpu_idle_ms": r.gpu_idle_ms,
            "exposed_comm_ms": r.exposed_comm_ms,
            "comm_after_backward_ms": r.comm_after_backward_ms,
            "samples_per_s": r.samples_per_s,
            "first_loss": first,
            "last_loss": last,
            "reference_err": r.reference_err,
            "ok": ok,
        });
        println!("summary {summary}");
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `--fault-tolerant`: joins the job (or rejoins it as a replacement),
/// trains, and leaves from the last group; rank 0 of that group prints what
/// happened and the checks.
fn fault_tolerant(cfg: &Config, ft: &FaultConfig, timeout: Duration) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gpu_trainer: cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    let run = rt.block_on(async {
        let pg = chorus::ProcessGroup::builder()
            .timeout(timeout)
            .init_from_env()
            .await
            .map_err(|e| e.to_string())?;
        let (pg, rep) = train_fault_tolerant(pg, cfg, ft)
            .await
            .map_err(|e| e.to_string())?;
        let lead = pg.rank() == 0;
        let world = pg.size();
        pg.shutdown().await.map_err(|e| e.to_string())?;
        Ok::<_, String>((lead, world, rep))
    });
    let (lead, world, rep) = match run {
        Ok(v) => v,
        Err(e) => {
            eprintln!("gpu_trainer failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !lead {
        return ExitCode::SUCCESS;
    }
    let ok = rep.reference_ok && rep.loss_fell;
    for (step, why) in &rep.failures {
        println!("step {step} was abandoned and redone: {why}");
    }
    let groups: Vec<String> = rep
        .groups
        .iter()
        .map(|(e, n)| format!("epoch {e}: {n} rank(s)"))
        .collect();
    println!("groups: {}", groups.join(", "));
    println!(
        "losses vs CPU reference, first {} step(s) before any failure: max relative difference {:.2e} (tolerance {:.0e}): {}",
        rep.reference.len(),
        rep.reference_err,
        cfg.check_tol,
        if rep.reference_ok { "OK" } else { "FAIL" }
    );
    let (first, last) = (
        rep.losses.first().copied().unwrap_or(0.0),
        rep.losses.last().copied().unwrap_or(0.0),
    );
    println!(
        "loss fell from {first:.6} to {last:.6}: {}",
        if rep.loss_fell { "OK" } else { "FAIL" }
    );
    println!(
        "parameters bit-identical on every rank of the group after each of {} steps (GPU hash all_gathered): OK",
        rep.hashes_checked
    );
    let summary = serde_json::json!({
        "impl": "chorus",
        "fault_tolerant": true,
        "world": world,
        "steps": cfg.steps,
        "failures": rep.failures.len(),
        "groups": rep.groups.len(),
        "first_loss": first,
        "last_loss": last,
        "reference_err": rep.reference_err,
        "ok": ok,
    });
    println!("summary {summary}");
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
