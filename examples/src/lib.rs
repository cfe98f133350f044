//! Helpers shared by the chorus examples, and the test kit of the
//! integration tests.
#![deny(unsafe_code)]

pub mod busbw;
pub mod gpu_train;
pub mod job_output;
pub mod latency;
pub mod netns;
pub mod report;
pub mod testkit;
pub mod timed;

use std::process::ExitCode;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Deterministic random data of `rank` for case `case` (small integers as
/// f32, so every reduction order gives the same result and any rank can
/// compute the reference).
pub fn rank_data(case: u64, rank: usize, len: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(case * 7919 + rank as u64);
    (0..len)
        .map(|_| rng.gen_range(-64i32..=64) as f32)
        .collect()
}

/// If no launcher set `RANK`, starts `nproc` copies of this program with the
/// torchrun environment (through `chorus-run` semantics: lines prefixed with
/// the rank, first failure stops the rest) and returns their exit code;
/// returns `None` inside a rank.
pub fn launch_self_if_needed(nproc: usize) -> Option<ExitCode> {
    let exe = match this_program_unless_a_rank()? {
        Ok(p) => p,
        Err(code) => return Some(code),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = chorus_launcher::launch_local(nproc.max(1), &exe, &args);
    Some(ExitCode::from(code.clamp(0, 255) as u8))
}

/// As [`launch_self_if_needed`], with `chorus-run --keep-going
/// --max-restarts max_restarts`: a rank that fails is restarted in place
/// (and rejoins the running group, see `GroupBuilder::rejoin_from_env`);
/// once the restarts are spent, the others run on.
pub fn launch_self_restarting_if_needed(nproc: usize, max_restarts: u32) -> Option<ExitCode> {
    let exe = match this_program_unless_a_rank()? {
        Ok(p) => p,
        Err(code) => return Some(code),
    };
    let mut argv: Vec<std::ffi::OsString> = vec![
        "chorus-run".into(),
        "--keep-going".into(),
        "--nproc-per-node".into(),
        nproc.max(1).to_string().into(),
        "--max-restarts".into(),
        max_restarts.to_string().into(),
        "--".into(),
        exe.into_os_string(),
    ];
    argv.extend(std::env::args_os().skip(1));
    let code = chorus_launcher::main_from_args(argv);
    Some(ExitCode::from(code.clamp(0, 255) as u8))
}

/// `None` inside a rank (a launcher set `RANK`, or SLURM's or Open MPI's
/// rank); otherwise this program's path to launch its ranks, or the exit
/// code to give when it cannot be found.
fn this_program_unless_a_rank() -> Option<Result<std::path::PathBuf, ExitCode>> {
    if std::env::var_os("RANK").is_some()
        || std::env::var_os("SLURM_PROCID").is_some()
        || std::env::var_os("OMPI_COMM_WORLD_RANK").is_some()
    {
        return None;
    }
    Some(std::env::current_exe().map_err(|e| {
        eprintln!("cannot find this program's path to launch ranks: {e}");
        ExitCode::FAILURE
    }))
}

/// The error type of the examples' rank bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Runs one rank of an example: starts a current-thread tokio runtime, joins
/// the job from the environment with op timeout `timeout`, runs `body` on
/// the world group, then leaves gracefully (`ProcessGroup::shutdown`: no
/// rank exits while another still reads from it).
///
/// # Errors
///
/// Whatever joining, `body` or leaving failed with.
pub fn run_rank<T, F, Fut>(timeout: std::time::Duration, body: F) -> Result<T, BoxError>
where
    F: FnOnce(chorus::ProcessGroup) -> Fut,
    Fut: std::future::Future<Output = Result<T, BoxError>>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let pg = chorus::ProcessGroup::builder()
            .timeout(timeout)
            .init_from_env()
            .await?;
        let out = body(pg.clone()).await?;
        pg.shutdown().await?;
        Ok(out)
    })
}
