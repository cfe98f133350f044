//! The growing-back loop of docs/FAULTS.md, as it stands there: every rank
//! — the first ones, the survivors of a failure and the replacements that
//! `chorus-run --max-restarts` starts — runs one loop with
//! `ProcessGroup::admit` at the top of each step, and takes rank 0's state
//! whenever `admit` returns a group.
//!
//! ```sh
//! # 3 ranks; rank 1 dies at step 40 and comes back:
//! cargo run --release -p chorus-examples --example growing_back -- \
//!     --nproc 3 --max-restarts 1 --kill 1@40
//! ```
//!
//! The gradients are small integers that depend on the step alone, so the
//! averaged gradient is exact in f32 on any number of ranks, and rank 0
//! checks the final parameters of every rank against the serial sum:
//! bit-identical everywhere, whoever died and came back. `--misplace` runs
//! a replacement as docs/FAULTS.md warns against — taking the state before
//! its first `admit` — to show the error it gets.

use std::process::ExitCode;
use std::time::Duration;

use chorus::{ProcessGroup, ReduceOp};
use chorus_examples::{launch_self_restarting_if_needed, BoxError};
use clap::Parser;

/// The growing-back loop of docs/FAULTS.md, checked.
#[derive(Parser, Debug)]
struct Args {
    /// Ranks to start when not launched by chorus-run/torchrun/srun.
    #[arg(long, default_value_t = 3)]
    nproc: usize,
    /// How many times a failed rank is restarted (chorus-run
    /// --max-restarts; the others keep going).
    #[arg(long, default_value_t = 1)]
    max_restarts: u32,
    /// Steps to run.
    #[arg(long, default_value_t = 100)]
    steps: u64,
    /// `RANK@STEP,...`: that world rank kills itself (SIGKILL) in that
    /// step, on its first start.
    #[arg(long, default_value = "")]
    kill: String,
    /// A replacement takes the state before its first `admit` (wrong).
    #[arg(long)]
    misplace: bool,
}

/// Parameters per rank.
const LEN: usize = 1024;

/// The gradient of step `step` (the same on every rank): small integers,
/// exact in any sum and average.
fn gradients(step: u64) -> Vec<f32> {
    (0..LEN as u64)
        .map(|i| ((step * 7 + i) % 5) as f32 - 2.0)
        .collect()
}

/// The parameters after `steps` steps, computed serially.
fn expected(steps: u64) -> Vec<f32> {
    let mut p = vec![0.0f32; LEN];
    for s in 0..steps {
        for (p, g) in p.iter_mut().zip(gradients(s)) {
            *p -= g;
        }
    }
    p
}

fn kills(spec: &str) -> Vec<(usize, u64)> {
    spec.split(',')
        .filter_map(|k| k.split_once('@'))
        .filter_map(|(r, s)| Some((r.parse().ok()?, s.parse().ok()?)))
        .collect()
}

async fn rank(args: Args) -> Result<bool, BoxError> {
    let replacement = std::env::var("CHORUS_RANK_RESTARTS").is_ok_and(|v| v != "0");
    let world_rank: usize = std::env::var("RANK")?.parse()?;
    let kills = kills(&args.kill);
    let mut failures = 0;

    let mut pg = ProcessGroup::init_from_env().await?; // rejoins if restarted
    if args.misplace && replacement {
        // Wrong: the survivors are inside `admit`; this op is refused.
        pg.broadcast(vec![0u64], 0)?.await?;
    }
    let mut step = 0u64;
    let mut params = vec![0.0f32; LEN];
    while step < args.steps {
        if let Some(g) = pg.admit(Duration::from_secs(2)).await? {
            pg = g;
            // Everyone takes rank 0's state (a replacement holds none); if
            // a member dies meanwhile, the group fails and the next admit
            // re-forms it.
            let taken = async {
                let s = pg.broadcast(vec![step], 0)?.await?;
                let p = pg.broadcast(params.clone(), 0)?.await?;
                Ok::<_, chorus::Error>((s[0], p))
            };
            match taken.await {
                Ok((s, p)) => (step, params) = (s, p),
                Err(_) => continue,
            }
        }
        if !replacement && kills.contains(&(world_rank, step)) {
            println!("VICTIM rank={world_rank} step={step} killing itself");
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
        let averaged =
            async { Ok::<_, chorus::Error>(pg.all_reduce(gradients(step), ReduceOp::Avg)?.await?) };
        match averaged.await {
            Ok(g) => {
                params.iter_mut().zip(&g).for_each(|(p, g)| *p -= g);
                step += 1;
            }
            Err(e) => {
                failures += 1;
                eprintln!("step {step} failed ({e}); the next admit re-forms the group");
            }
        }
    }

    // Every rank's parameters, bit for bit, against the serial result.
    let bits: Vec<i32> = params.iter().map(|p| p.to_bits() as i32).collect();
    let lo = pg.all_reduce(bits.clone(), ReduceOp::Min)?.await?;
    let hi = pg.all_reduce(bits, ReduceOp::Max)?.await?;
    let want: Vec<i32> = expected(args.steps)
        .iter()
        .map(|p| p.to_bits() as i32)
        .collect();
    let ok = lo == want && hi == want;
    if pg.rank() == 0 {
        println!(
            "growing back: {} steps; final group of {} ranks (epoch {}); this rank saw {failures} failed step(s); parameters bit-identical on all {} ranks and equal to the serial result: {}",
            args.steps,
            pg.size(),
            pg.epoch(),
            pg.size(),
            if ok { "OK" } else { "WRONG" }
        );
    }
    pg.barrier()?.await?;
    pg.shutdown().await?;
    Ok(ok)
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(code) = launch_self_restarting_if_needed(args.nproc, args.max_restarts) {
        return code;
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start a tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(rank(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
