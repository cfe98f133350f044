//! Re-forming a group with ranks as separate processes under `chorus-run`
//! (the launcher hosts the store): a rank SIGKILLed mid all_reduce, rank 0
//! included; a rank SIGSTOPped, which, continued after the others
//! re-formed, is voted out. Every survivor checks an all_reduce on the new
//! group against the serial reference (`chorus-test-rank reform-*`).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tests_integration::job_output::{self, field};
use tests_integration::testkit::workspace_bin;

/// RESULT lines by rank: (kind, message).
type Results = BTreeMap<usize, (String, String)>;

/// Runs `scenario` on `world` ranks with `victim`; the victim, if it
/// stopped itself, is continued once every other rank has reported.
/// Returns every rank's RESULT that came.
fn run(scenario: &str, world: usize, victim: usize) -> Results {
    // The aborted old groups dump their flight recorders here.
    let traces = std::env::temp_dir().join(format!(
        "chorus-reform-{scenario}-{world}-{victim}-{}",
        std::process::id()
    ));
    let results = run_in(scenario, world, victim, &traces);
    let _ = std::fs::remove_dir_all(&traces);
    results
}

fn run_in(scenario: &str, world: usize, victim: usize, traces: &std::path::Path) -> Results {
    let (mut child, rx, reader) = job_output::spawn(
        Command::new(workspace_bin("chorus-launcher", "chorus-run"))
            .args(["--keep-going", "--nproc-per-node", &world.to_string(), "--"])
            .arg(env!("CARGO_BIN_EXE_chorus-test-rank"))
            .arg(scenario)
            .env("FAULT_TIMEOUT_MS", "600")
            .env("FAULT_WINDOW_MS", "800")
            .env("FAULT_RANK", victim.to_string())
            .env("CHORUS_TRACE_DIR", traces),
    );
    let mut results = Results::new();
    let mut lines = Vec::new();
    let mut stopped: Option<i32> = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(line) => {
                let body = job_output::body(&line).to_string();
                if body.starts_with("RESULT") {
                    let rank = field(&body, "rank")
                        .and_then(|v| v.parse().ok())
                        .expect("rank");
                    let kind = field(&body, "kind").unwrap_or("").to_string();
                    let msg = body.split_once("msg=").map_or("", |(_, m)| m).to_string();
                    results.insert(rank, (kind, msg));
                }
                if body.starts_with("VICTIM") && body.contains("stopping") {
                    stopped = field(&body, "pid").and_then(|v| v.parse().ok());
                }
                lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let others = (0..world)
            .filter(|r| *r != victim)
            .all(|r| results.contains_key(&r));
        if others {
            if let Some(pid) = stopped.take() {
                let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "{scenario}: no end within 60 s; output:\n{}",
                lines.join("\n")
            );
        }
    }
    let _ = child.wait();
    reader.join().expect("reader");
    results
}

fn assert_reformed(results: &Results, world: usize, victim: usize) {
    let survivors: Vec<usize> = (0..world).filter(|r| *r != victim).collect();
    for (i, r) in survivors.iter().enumerate() {
        let (kind, msg) = results
            .get(r)
            .unwrap_or_else(|| panic!("rank {r} reported nothing"));
        assert_eq!(kind, "Reformed", "rank {r}: {msg}");
        let want = format!("epoch=1 size={} rank={i}", survivors.len());
        assert!(msg.contains(&want), "rank {r}: {msg} (expected {want})");
    }
}

#[test]
fn a_killed_rank_is_left_behind_and_the_survivors_go_on() {
    let results = run("reform-kill", 3, 1);
    assert_reformed(&results, 3, 1);
}

#[test]
fn rank_0_killed_the_launchers_store_serves_the_survivors() {
    let results = run("reform-kill", 4, 0);
    assert_reformed(&results, 4, 0);
}

#[test]
fn a_stopped_rank_continued_after_the_reform_is_voted_out() {
    let results = run("reform-stop", 3, 1);
    assert_reformed(&results, 3, 1);
    let (kind, msg) = results
        .get(&1)
        .expect("the stopped rank reports once continued");
    assert_eq!(kind, "VotedOut", "{msg}");
    assert!(msg.contains("epoch=1 members=[0, 2]"), "{msg}");
}
