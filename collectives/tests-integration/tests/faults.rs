//! Fault injection with separate processes started by `chorus-run`: a rank
//! SIGKILLed mid-all_reduce, a rank SIGSTOPped (without and with error
//! propagation through the store), mismatched collectives, the store's host
//! dying. Each fault runs 20 times; every run must end without
//! a hang and leave no process behind.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tests_integration::job_output::{self, alive, field};
use tests_integration::testkit::workspace_bin;

const RUNS: usize = 20;
const WORLD: usize = 3;
const TIMEOUT_MS: u64 = 600;

#[derive(Debug, Default)]
struct Outcome {
    /// RESULT lines by rank: (kind, elapsed ms, message).
    results: BTreeMap<usize, (String, u64, String)>,
    pids: Vec<i32>,
    lines: Vec<String>,
}

/// Runs `scenario` across WORLD ranks; once every survivor has reported,
/// SIGKILLs a victim that is still around (a stopped one).
fn run(scenario: &str, trace_dir: &Path) -> Outcome {
    run_with(scenario, trace_dir, &[])
}

/// [`run`] with extra environment variables for the ranks.
fn run_with(scenario: &str, trace_dir: &Path, env: &[(&str, &str)]) -> Outcome {
    run_args(scenario, trace_dir, env, &[])
}

/// [`run_with`] with extra `chorus-run` arguments.
fn run_args(scenario: &str, trace_dir: &Path, env: &[(&str, &str)], launcher: &[&str]) -> Outcome {
    run_world(scenario, trace_dir, env, launcher, WORLD)
}

/// [`run_args`] with `world` ranks.
fn run_world(
    scenario: &str,
    trace_dir: &Path,
    env: &[(&str, &str)],
    launcher: &[&str],
    world: usize,
) -> Outcome {
    let (mut child, rx, reader) = job_output::spawn(
        Command::new(workspace_bin("chorus-launcher", "chorus-run"))
            .args(launcher)
            .args(["--keep-going", "--nproc-per-node", &world.to_string(), "--"])
            .arg(env!("CARGO_BIN_EXE_chorus-test-rank"))
            .arg(scenario)
            .env("FAULT_TIMEOUT_MS", TIMEOUT_MS.to_string())
            .env("FAULT_RANK", "1")
            .env("CHORUS_TRACE_DIR", trace_dir)
            .env("CHORUS_WATCHDOG_INTERVAL_MS", "5")
            .envs(env.iter().copied()),
    );
    let mut out = Outcome::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    let survivors = world - 1;
    let mut victim: Option<i32> = None;
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(line) => {
                let body = job_output::body(&line).to_string();
                if body.starts_with("RESULT") {
                    let rank: usize = field(&body, "rank")
                        .and_then(|v| v.parse().ok())
                        .expect("rank");
                    let kind = field(&body, "kind").unwrap_or("").to_string();
                    let ms: u64 = field(&body, "elapsed_ms")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(u64::MAX);
                    let msg = body.split_once("msg=").map_or("", |(_, m)| m).to_string();
                    out.results.insert(rank, (kind, ms, msg));
                }
                if body.starts_with("VICTIM") || body.starts_with("PID") {
                    if let Some(pid) = field(&body, "pid").and_then(|v| v.parse().ok()) {
                        out.pids.push(pid);
                        if body.starts_with("VICTIM") {
                            victim = Some(pid);
                        }
                    }
                }
                out.lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if out.results.len() >= survivors {
            if let Some(pid) = victim.take() {
                if alive(pid) {
                    let pid = nix::unistd::Pid::from_raw(pid);
                    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                }
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "{scenario}: no end within 60 s; output so far:\n{}",
                out.lines.join("\n")
            );
        }
    }
    let status = child.wait().expect("wait chorus-run");
    reader.join().expect("reader");
    assert!(status.code().is_some() || status.code().is_none());
    for pid in &out.pids {
        // Reaped children vanish; give the kernel a moment.
        let t = Instant::now();
        while alive(*pid) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!alive(*pid), "{scenario}: rank process {pid} leaked");
    }
    out
}

fn survivors_failed_within(out: &Outcome, ranks: &[usize], kinds: &[&str], limit_ms: u64) {
    for r in ranks {
        let (kind, ms, msg) = out
            .results
            .get(r)
            .unwrap_or_else(|| panic!("rank {r} reported nothing:\n{}", out.lines.join("\n")));
        assert!(kinds.contains(&kind.as_str()), "rank {r}: {kind}: {msg}");
        assert!(
            *ms <= limit_ms,
            "rank {r} failed after {ms} ms (limit {limit_ms}): {msg}"
        );
    }
}

fn trace(dir: &Path) -> String {
    let out = Command::new(workspace_bin("chorus-launcher", "chorus-trace"))
        .arg(dir)
        .output()
        .expect("run chorus-trace");
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

fn temp_dir(tag: &str, i: usize) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("chorus-faults-{}-{tag}-{i}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

#[test]
fn sigkill_mid_all_reduce_fails_every_survivor_within_timeout() {
    for i in 0..RUNS {
        let dir = temp_dir("kill", i);
        let out = run("kill", &dir);
        survivors_failed_within(
            &out,
            &[0, 2],
            &["PeerLost", "OpTimeout", "GroupErrored", "Aborted"],
            TIMEOUT_MS + 1000,
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A rank SIGKILLed between two small all_reduces of a group of 12 ranks
/// on one host, whose small ops run on the group's shared-memory board
/// (no connection tells of the death): every survivor fails with
/// `PeerLost` naming it, long before its 30 s op timeout, and nothing is
/// left in /dev/shm.
#[test]
fn sigkill_before_a_board_op_fails_every_survivor_naming_the_dead_rank() {
    const BOARD_WORLD: usize = 12;
    for i in 0..5 {
        let dir = temp_dir("board-kill", i);
        let out = run_world(
            "board-kill",
            &dir,
            &[("FAULT_TIMEOUT_MS", "30000"), ("FAULT_RANK", "5")],
            &[],
            BOARD_WORLD,
        );
        let survivors: Vec<usize> = (0..BOARD_WORLD).filter(|&r| r != 5).collect();
        survivors_failed_within(&out, &survivors, &["PeerLost"], 3000);
        for r in &survivors {
            let (_, _, msg) = &out.results[r];
            assert!(
                msg.contains("rank 5") && msg.contains("board"),
                "rank {r}: {msg}"
            );
        }
        if let Ok(d) = std::fs::read_dir("/dev/shm") {
            for e in d.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                assert!(!name.contains("chorus"), "left in /dev/shm: {name}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn sigstop_times_out_and_chorus_trace_names_the_stopped_rank() {
    for i in 0..RUNS {
        let dir = temp_dir("stop", i);
        let out = run("stop", &dir);
        // The first survivor to time out aborts its group and tells the
        // other (Remote, naming the timeout) just before that one's own
        // timeout; at least one must report the timeout.
        survivors_failed_within(
            &out,
            &[0, 2],
            &["OpTimeout", "Remote", "PeerLost", "GroupErrored", "Aborted"],
            TIMEOUT_MS + 1000,
        );
        assert!(
            out.results.values().any(|(k, _, _)| k == "OpTimeout"),
            "{:?}",
            out.results
        );
        trace_names_rank_1_behind_at_seq_3(&dir);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_stopped_rank_is_found_silent_within_the_liveness_timeout_however_long_the_op_timeout() {
    // Op timeout 60 s, peer liveness 1 s: the survivors fail on the stopped
    // rank's silence, not on their op timeout.
    const LIVENESS_MS: u64 = 1000;
    for i in 0..5 {
        let dir = temp_dir("silent", i);
        let out = run_with(
            "stop",
            &dir,
            &[
                ("FAULT_TIMEOUT_MS", "60000"),
                ("CHORUS_PEER_LIVENESS_MS", &LIVENESS_MS.to_string()),
            ],
        );
        // The first survivor to fail aborts and closes its connections: the
        // other may see that close first.
        survivors_failed_within(
            &out,
            &[0, 2],
            &["PeerSilent", "PeerLost", "GroupErrored", "Aborted"],
            LIVENESS_MS + 1000,
        );
        let named: Vec<&String> = out
            .results
            .values()
            .filter(|(k, _, _)| k == "PeerSilent")
            .map(|(_, _, m)| m)
            .collect();
        assert!(!named.is_empty(), "{:?}", out.results);
        for m in named {
            assert!(m.contains("rank 1 went silent"), "{m}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The trace of the dumps in `dir` finds the stopped rank 1 behind at seq 3.
fn trace_names_rank_1_behind_at_seq_3(dir: &Path) {
    let report = trace(dir);
    assert!(report.contains("first divergence at seq 3"), "{report}");
    assert!(
        report.contains("behind (never issued seq 3): ranks [1]"),
        "{report}"
    );
}

#[test]
fn propagated_failure_fails_the_other_ranks_long_before_their_own_timeout() {
    for i in 0..RUNS {
        let dir = temp_dir("propagate", i);
        let out = run("propagate", &dir);
        // Rank 0 runs its op under TIMEOUT_MS and detects the stopped rank.
        survivors_failed_within(&out, &[0], &["OpTimeout"], TIMEOUT_MS + 1000);
        // Rank 2's own timeout is 30 s; rank 0's published failure fails it
        // at about the same time as rank 0, naming rank 0 and its cause.
        survivors_failed_within(&out, &[2], &["Remote"], TIMEOUT_MS + 1000);
        let (_, _, msg) = &out.results[&2];
        assert!(msg.contains("rank 0 of the group failed"), "{msg}");
        assert!(
            msg.contains("rank 0 in group 'world' at seq 3 (all_reduce): op timed out"),
            "{msg}"
        );
        // Both dumped their flight recorders: the trace still names rank 1.
        trace_names_rank_1_behind_at_seq_3(&dir);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn mismatched_collectives_are_named_by_the_error_and_by_chorus_trace() {
    for i in 0..RUNS {
        let dir = temp_dir("mismatch", i);
        let out = run("mismatch", &dir);
        for r in 0..WORLD {
            let (kind, _, msg) = out
                .results
                .get(&r)
                .unwrap_or_else(|| panic!("rank {r} reported nothing:\n{}", out.lines.join("\n")));
            assert!(
                ["Mismatch", "GroupErrored", "PeerLost", "Aborted"].contains(&kind.as_str()),
                "rank {r}: {kind}: {msg}"
            );
        }
        // At least the ranks that talk to the odd one out name both sides.
        let named = out
            .results
            .values()
            .filter(|(k, _, m)| {
                k == "Mismatch" && m.contains("all_gather") && m.contains("all_reduce")
            })
            .count();
        assert!(named >= 1, "{:?}", out.results);
        let report = trace(&dir);
        assert!(report.contains("first divergence at seq 1"), "{report}");
        assert!(
            report.contains("called a different op/dtype/count: ranks [1]"),
            "{report}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// chorus-run serves the store: rank 0's death leaves it serving, and the
/// survivors form a new group through it and run an op.
#[test]
fn the_store_outlives_rank_0_under_chorus_run() {
    for i in 0..RUNS / 4 {
        let dir = temp_dir("store-lives", i);
        let out = run("store-dies", &dir);
        for r in [1, 2] {
            let (kind, _, msg) = out
                .results
                .get(&r)
                .unwrap_or_else(|| panic!("rank {r} reported nothing:\n{}", out.lines.join("\n")));
            assert_eq!(kind, "none", "rank {r}: {msg}");
            assert!(msg.contains("sum 2"), "rank {r}: {msg}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// With the store on rank 0 (`--rank0-store`), its death gives every rank
/// a store error, promptly.
#[test]
fn rank_0_store_death_gives_every_rank_a_store_error() {
    for i in 0..RUNS {
        let dir = temp_dir("store", i);
        let out = run_args("store-dies", &dir, &[], &["--rank0-store"]);
        survivors_failed_within(&out, &[1, 2], &["Store"], 10_000);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The same with error propagation on: its publisher and watcher give up on
/// the dead store instead of hanging the ranks (fewer runs: the store's
/// side is the same as above).
#[test]
fn rank_0_store_death_with_error_propagation_on_does_not_hang() {
    for i in 0..RUNS / 4 {
        let dir = temp_dir("store-prop", i);
        let out = run_args(
            "store-dies",
            &dir,
            &[("CHORUS_PROPAGATE_ERRORS", "1")],
            &["--rank0-store"],
        );
        survivors_failed_within(&out, &[1, 2], &["Store"], 10_000);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
