//! Ranks die with the `chorus-run` that started them.
//!
//! A launcher killed with SIGKILL cannot stop its ranks; left running, they
//! would hold their connections open and the job's other nodes would wait
//! on them until an op timed out. `chorus-run` therefore names itself in
//! `CHORUS_RUN_PID`, and a rank that finds it there asks the kernel for
//! SIGKILL when its parent dies (`PR_SET_PDEATHSIG`): the launcher, or a
//! shell between them. Other launchers (torchrun, srun) do not set the
//! variable and nothing changes for them.

/// The variable `chorus-run` sets to its process id.
pub const LAUNCHER_PID_VAR: &str = "CHORUS_RUN_PID";

/// Ties this process to the launcher named in [`LAUNCHER_PID_VAR`], if
/// any: it is killed when its parent exits.
///
/// # Errors
///
/// The launcher's pid and what was found, when it has already exited or
/// the kernel refused the request (`RendezvousError::LauncherGone`).
pub(super) fn tie_to_launcher() -> Result<(), (i32, String)> {
    let Some(pid) = std::env::var(LAUNCHER_PID_VAR)
        .ok()
        .and_then(|v| v.trim().parse::<i32>().ok())
    else {
        return Ok(());
    };
    tie(pid)
}

#[cfg(target_os = "linux")]
fn tie(pid: i32) -> Result<(), (i32, String)> {
    use nix::errno::Errno;
    use nix::sys::prctl::set_pdeathsig;
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::{getppid, Pid};
    set_pdeathsig(Signal::SIGKILL).map_err(|e| (pid, format!("PR_SET_PDEATHSIG failed: {e}")))?;
    // The signal comes when the parent dies. The parent is the launcher,
    // or a process between them (a shell running the program): that one's
    // death then kills this rank. Had the launcher died before the
    // request, no signal would come: then it is gone.
    let parent = getppid().as_raw();
    if parent != pid && kill(Pid::from_raw(pid), None) == Err(Errno::ESRCH) {
        return Err((
            pid,
            format!("no such process; this process's parent is now pid {parent}"),
        ));
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn tie(_pid: i32) -> Result<(), (i32, String)> {
    Ok(())
}
