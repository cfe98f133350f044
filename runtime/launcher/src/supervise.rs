//! Starting the ranks, watching them, forwarding signals, stopping them.
//!
//! Each rank runs in its own process group (`setpgid(0, 0)`), so signals are
//! sent to the whole group (a rank that is a shell script takes its children
//! with it) and a Ctrl-C in the terminal reaches chorus-run only, which
//! forwards it once. A rank that exits while processes of its group still
//! run (background children) has them stopped: SIGTERM, then SIGKILL after
//! the kill timeout; chorus-run waits for that before it exits. Every child is reaped by chorus-run before it exits,
//! and `kill_on_drop` SIGKILLs any child still running if chorus-run
//! unwinds. If chorus-run itself is SIGKILLed, the ranks are orphaned: their
//! next write to the closed output pipe kills them (SIGPIPE).

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::{sleep_until, Instant};

use super::cli::{Args, Plan};
use super::output::{pump, Stream, Writer};

/// How long the output of exited ranks is still drained (a background
/// process the rank left behind may hold its pipe open).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// How often chorus-run checks whether what exited ranks left behind is
/// gone, once every rank has exited.
const LEFTOVER_POLL: Duration = Duration::from_millis(20);

/// Exit code of a finished rank: its code, or 128+N when killed by signal N.
fn exit_code(st: ExitStatus) -> i32 {
    match (st.code(), st.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => 1,
    }
}

fn describe(st: ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => match Signal::try_from(s) {
            Ok(sig) => format!("was killed by signal {s} ({sig})"),
            Err(_) => format!("was killed by signal {s}"),
        },
        (None, None) => format!("ended with status {st}"),
    }
}

/// Sends `sig` to the process group of every rank still running.
/// Signals every rank's process group, highest rank first: rank 0, which
/// hosts the job's store, goes last, so a rank that is still running never
/// sees the store vanish (and reports that instead of the first failure)
/// before its own signal.
fn signal_all(alive: &BTreeMap<u32, Pid>, sig: Signal) {
    for pgid in alive.values().rev() {
        // ESRCH: it exited and is about to be reaped; nothing to do.
        let _ = killpg(*pgid, sig);
    }
}

/// Whether process group `pgid` has a member that is not a zombie (an
/// orphan's zombie waits for init, which may take a while to reap it).
fn group_alive(pgid: Pid) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        // No /proc: any member, zombies included.
        return killpg(pgid, None).is_ok();
    };
    dir.flatten().any(|e| {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            return false;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        // "pid (comm) state ppid pgrp ..."; comm may contain anything.
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            return false;
        };
        let mut f = rest.split_ascii_whitespace();
        let state = f.next().unwrap_or("Z");
        let pgrp = f.nth(1).and_then(|g| g.parse::<i32>().ok());
        pgrp == Some(pgid.as_raw()) && !matches!(state, "Z" | "X")
    })
}

fn log(msg: &str) {
    eprintln!("chorus-run: {msg}");
}

/// Runs the job; returns chorus-run's exit code.
pub(crate) async fn run(args: Args, mut plan: Plan) -> i32 {
    // Node 0's chorus-run serves the job's store until every local rank is
    // done (the other nodes' ranks reach it on the master address).
    let _store = if plan.hosts_store() {
        let addr = plan.store_bind_addr();
        match chorus_store::TcpStoreServer::bind(addr, chorus_store::ServerOptions::from_env())
            .await
        {
            Ok(server) => {
                plan.master_port = server.local_addr().port();
                Some(server)
            }
            Err(e) => {
                log(&format!(
                    "cannot serve the job's store on {addr}: {e}; is --master-port free on this node \
                     and --master-addr one of its addresses?"
                ));
                return 1;
            }
        }
    } else {
        None
    };
    // Listen before the first child exists, so no signal is lost.
    // SIGHUP too: the ranks are not in the terminal's process group, so
    // they would not get it when the terminal goes away.
    let (mut sigint, mut sigterm, mut sighup) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(i), Ok(t), Ok(h)) => (i, t, h),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            log(&format!("cannot install signal handlers: {e}"));
            return 1;
        }
    };
    let (out, err) = match (Writer::spawn(Stream::Stdout), Writer::spawn(Stream::Stderr)) {
        (Ok(o), Ok(e)) => (o, e),
        (Err(e), _) | (_, Err(e)) => {
            log(&format!("cannot start output threads: {e}"));
            return 1;
        }
    };

    if let Some(gpu) = &plan.shared_gpu {
        log(&gpu.warning(plan.nproc_per_node));
    }
    let mut alive: BTreeMap<u32, Pid> = BTreeMap::new();
    let mut waits = FuturesUnordered::new();
    let mut pumps = Vec::new();
    // (rank, code) of the first rank that failed.
    let mut failure: Option<(u32, i32)> = None;
    // Restarts left on this node, and each local rank's count so far.
    let mut restarts_left = args.max_restarts;
    let mut restarts: BTreeMap<u32, u32> = BTreeMap::new();

    for local in 0..plan.nproc_per_node {
        match start_rank(&args, &plan, local, 0, &out, &err) {
            Ok(started) => {
                pumps.extend(started.pumps);
                if let Some(pid) = started.pid {
                    alive.insert(started.rank, pid);
                }
                waits.push(started.wait);
            }
            Err(code) => {
                failure = Some((plan.rank(local), code));
                break;
            }
        }
    }

    let mut ranks = Running {
        alive,
        leftover: BTreeMap::new(),
        kill_at: None,
        kill_timeout: args.kill_timeout,
    };
    if failure.is_some() && !ranks.alive.is_empty() {
        log("stopping the ranks already started");
        ranks.stop(Signal::SIGTERM);
    }
    let mut got_signal: Option<Signal> = None;

    while !waits.is_empty() || !ranks.leftover.is_empty() {
        let far = Instant::now() + Duration::from_secs(86_400);
        let kill_at = ranks.kill_at;
        let leftover_at = ranks.leftover.values().map(|l| l.1).min();
        let only_leftovers = waits.is_empty();
        tokio::select! {
            Some((rank, res)) = waits.next() => {
                ranks.reaped(rank);
                let (code, what) = match res {
                    Ok(st) => (exit_code(st), describe(st)),
                    Err(e) => (1, format!("could not be waited for: {e}")),
                };
                let restartable = code != 0
                    && restarts_left > 0
                    && failure.is_none()
                    && got_signal.is_none()
                    && ranks.kill_at.is_none();
                if restartable {
                    restarts_left -= 1;
                    let local = rank - plan.rank(0);
                    let k = restarts.entry(local).or_insert(0);
                    *k += 1;
                    log(&format!(
                        "rank {rank} {what}; restarting it in place (restart {k} of this rank, {restarts_left} left on this node)"
                    ));
                    match start_rank(&args, &plan, local, *k, &out, &err) {
                        Ok(started) => {
                            pumps.extend(started.pumps);
                            if let Some(pid) = started.pid {
                                ranks.alive.insert(started.rank, pid);
                            }
                            waits.push(started.wait);
                            continue;
                        }
                        Err(c) => {
                            failure = Some((rank, c));
                            if !ranks.alive.is_empty() && !args.keep_going {
                                ranks.stop(Signal::SIGTERM);
                            }
                            continue;
                        }
                    }
                }
                if code != 0 && failure.is_none() {
                    failure = Some((rank, code));
                    if ranks.alive.is_empty() || ranks.kill_at.is_some() {
                        // Nothing left to stop, or already stopping.
                        log(&format!("rank {rank} {what}"));
                    } else if args.keep_going {
                        log(&format!("rank {rank} {what}; the other ranks run on (--keep-going)"));
                    } else {
                        log(&format!(
                            "rank {rank} {what}; stopping the other ranks (SIGTERM, SIGKILL after {:?})",
                            args.kill_timeout
                        ));
                        ranks.stop(Signal::SIGTERM);
                    }
                }
            }
            Some(()) = sigint.recv() => ranks.on_signal(Signal::SIGINT, &mut got_signal),
            Some(()) = sigterm.recv() => ranks.on_signal(Signal::SIGTERM, &mut got_signal),
            Some(()) = sighup.recv() => ranks.on_signal(Signal::SIGHUP, &mut got_signal),
            () = sleep_until(kill_at.unwrap_or(far)), if kill_at.is_some() => {
                log(&format!(
                    "ranks {:?} still running after {:?}; sending SIGKILL",
                    ranks.alive.keys().collect::<Vec<_>>(),
                    args.kill_timeout
                ));
                ranks.kill_all();
                ranks.kill_at = Some(far);
            }
            () = sleep_until(leftover_at.unwrap_or(far)), if leftover_at.is_some() => {
                ranks.kill_due_leftovers();
            }
            // Every rank exited: finish as soon as what they left is gone.
            () = tokio::time::sleep(LEFTOVER_POLL), if only_leftovers => {
                ranks.leftover.retain(|_, (pgid, _)| group_alive(*pgid));
            }
        }
    }

    // Every local rank is done. Node 0 serves the store: while ranks of
    // other nodes may still be leaving it, it must not go away.
    if let (Some(server), None, None) = (&_store, failure, got_signal) {
        if plan.nnodes > 1 {
            wait_for_other_nodes(&plan, server.local_addr()).await;
        }
    }

    // Every child is reaped; drain what they wrote, then flush our streams.
    let aborts: Vec<_> = pumps.iter().map(|p| p.abort_handle()).collect();
    let drain = futures::future::join_all(pumps);
    tokio::pin!(drain);
    if tokio::time::timeout(DRAIN_TIMEOUT, &mut drain)
        .await
        .is_err()
    {
        log("some rank output is still open after every rank exited (a background process?); not waiting for it");
        aborts.iter().for_each(|a| a.abort());
        // Aborted pumps drop their senders, so the writers can finish.
        drain.await;
    }
    out.close();
    err.close();

    match (failure, got_signal) {
        (Some((rank, code)), _) => {
            log(&format!(
                "exiting with code {code} (rank {rank} failed first)"
            ));
            code
        }
        (None, Some(sig)) => 128 + sig as i32,
        (None, None) => 0,
    }
}

/// How long node 0, its own ranks done, keeps serving the store for the
/// other nodes' ranks to leave it: they end with the same last op, so
/// their goodbyes are a few round trips away; a rank that is cut off or
/// still busy leaves without one (`chorus_store::rendezvous`).
const LEAVE_GRACE: Duration = Duration::from_secs(2);

/// Node 0, its own ranks done: serves the job's store until the other
/// nodes' ranks have left it too, for at most [`LEAVE_GRACE`].
async fn wait_for_other_nodes(plan: &Plan, served: std::net::SocketAddr) {
    use chorus_store::rendezvous::wait_until_all_left;
    let ip = if served.ip().is_unspecified() {
        std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
    } else {
        served.ip()
    };
    let addr = std::net::SocketAddr::new(ip, served.port()).to_string();
    let world = (plan.nnodes * plan.nproc_per_node) as usize;
    let client = match chorus_store::TcpStore::connect(
        &addr,
        chorus_store::ClientOptions::from_env(),
    )
    .await
    {
        Ok(c) => c,
        Err(e) => {
            log(&format!("cannot read the job's store at {addr} to wait for the other nodes' ranks to leave: {e}"));
            return;
        }
    };
    if let Err(e) = wait_until_all_left(&client, world, LEAVE_GRACE).await {
        log(&format!("stopping the job's store: {e}"));
    }
}

/// A started rank: its global rank, process group, output pumps and the
/// future of its exit.
struct Started {
    rank: u32,
    /// `None` if it exited before it could be watched (its exit is still
    /// reaped through `wait`).
    pid: Option<Pid>,
    pumps: Vec<tokio::task::JoinHandle<()>>,
    wait: RankExit,
}

type RankExit =
    std::pin::Pin<Box<dyn std::future::Future<Output = (u32, std::io::Result<ExitStatus>)> + Send>>;

/// Starts local rank `local` for the `restarts`-th time (0: its first
/// start), its output prefixed with its rank; on failure logs why and
/// returns the exit code to report (127: not found, 126: not executable).
fn start_rank(
    args: &Args,
    plan: &Plan,
    local: u32,
    restarts: u32,
    out: &Writer,
    err: &Writer,
) -> Result<Started, i32> {
    let program = &args.command[0];
    let rank = plan.rank(local);
    let mut cmd = Command::new(program);
    cmd.args(&args.command[1..])
        .envs(plan.rank_env(local, restarts))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| {
        log(&format!(
            "cannot start rank {rank} ({}): {e}",
            program.to_string_lossy()
        ));
        match e.kind() {
            std::io::ErrorKind::NotFound => 127,
            std::io::ErrorKind::PermissionDenied => 126,
            _ => 1,
        }
    })?;
    let prefix = format!("[rank {rank}] ").into_bytes();
    let mut pumps = Vec::new();
    if let Some(o) = child.stdout.take() {
        pumps.push(tokio::spawn(pump(o, prefix.clone(), out.sender())));
    }
    if let Some(e) = child.stderr.take() {
        pumps.push(tokio::spawn(pump(e, prefix, err.sender())));
    }
    Ok(Started {
        rank,
        pid: child.id().map(|pid| Pid::from_raw(pid as i32)),
        pumps,
        wait: Box::pin(async move { (rank, child.wait().await) }),
    })
}

/// The ranks still running and when they get SIGKILL.
#[derive(Debug)]
struct Running {
    /// Process group (= pid) of each rank not yet reaped.
    alive: BTreeMap<u32, Pid>,
    /// Process groups of exited ranks that still had members (background
    /// children the rank left behind), and when they get SIGKILL.
    leftover: BTreeMap<u32, (Pid, Instant)>,
    /// Once set, the ranks still running were sent a stopping signal and
    /// get SIGKILL at this instant.
    kill_at: Option<Instant>,
    kill_timeout: Duration,
}

impl Running {
    /// Rank `rank` was reaped. Whatever it left running in its process
    /// group gets SIGTERM now and SIGKILL after the kill timeout.
    fn reaped(&mut self, rank: u32) {
        let Some(pgid) = self.alive.remove(&rank) else {
            return;
        };
        if group_alive(pgid) {
            log(&format!(
                "rank {rank} exited but left processes behind; stopping them (SIGTERM, SIGKILL after {:?})",
                self.kill_timeout
            ));
            let _ = killpg(pgid, Signal::SIGTERM);
            self.leftover
                .insert(rank, (pgid, Instant::now() + self.kill_timeout));
        }
    }

    /// SIGKILL to every rank and everything left behind.
    fn kill_all(&mut self) {
        signal_all(&self.alive, Signal::SIGKILL);
        for (pgid, _) in std::mem::take(&mut self.leftover).into_values() {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }

    /// SIGKILL to the leftover groups whose time is up.
    fn kill_due_leftovers(&mut self) {
        let now = Instant::now();
        self.leftover.retain(|_, (pgid, at)| {
            if *at > now {
                return true;
            }
            let _ = killpg(*pgid, Signal::SIGKILL);
            false
        });
    }

    /// Sends `sig` to every rank (and what exited ranks left behind) and
    /// arms the SIGKILL deadline.
    fn stop(&mut self, sig: Signal) {
        signal_all(&self.alive, sig);
        for (pgid, _) in self.leftover.values() {
            let _ = killpg(*pgid, sig);
        }
        if self.kill_at.is_none() {
            self.kill_at = Some(Instant::now() + self.kill_timeout);
        }
    }

    /// SIGINT/SIGTERM/SIGHUP to chorus-run: forwarded; a second one kills.
    fn on_signal(&mut self, sig: Signal, got_signal: &mut Option<Signal>) {
        if got_signal.is_some() {
            log(&format!("{sig} again; killing every rank (SIGKILL)"));
            self.kill_all();
            return;
        }
        *got_signal = Some(sig);
        log(&format!(
            "got {sig}; forwarding it to every rank (SIGKILL after {:?})",
            self.kill_timeout
        ));
        self.stop(sig);
    }
}
