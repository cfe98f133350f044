//! A program that launches its own ranks when no launcher started it.

use std::process::ExitCode;

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
