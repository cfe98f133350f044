//! The group grows back, with ranks as separate processes under
//! `chorus-run --max-restarts` (the launcher hosts the store): ranks
//! SIGKILLed mid all_reduce of 4 B and of 16 MiB (a random non-zero rank,
//! rank 0, two at once) come back as replacement ranks and rejoin; the
//! survivors re-form within the op timeout + 1 s, every group's ops match
//! the serial reference, and afterwards every rank holds bit-identical
//! parameters (`chorus-test-rank grow`). No rank process outlives the
//! job, and nothing is left in /dev/shm. `GROW_RUNS` (default 20) runs of
//! each case.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use tests_integration::job_output::{self, alive, field};
use tests_integration::testkit::workspace_bin;

const TIMEOUT_MS: u64 = 600;

#[derive(Default, Debug)]
struct Run {
    /// RESULT by world rank: (kind, msg); the replacement's overwrites
    /// nothing (its predecessor died before reporting).
    results: BTreeMap<usize, (String, String)>,
    /// REFORMED elapsed_ms by survivor.
    reformed: Vec<u64>,
    /// Death (VICTIM at_ms) and replacement's first op (FIRST_OP at_ms).
    died_at: BTreeMap<usize, u128>,
    first_op_at: BTreeMap<usize, u128>,
    pids: Vec<i32>,
    lines: Vec<String>,
}

fn runs() -> usize {
    std::env::var("GROW_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

fn run(world: usize, victims: &[usize], elems: usize, restarts: usize) -> Run {
    let list: Vec<String> = victims.iter().map(usize::to_string).collect();
    let (mut child, rx, reader) = job_output::spawn(
        Command::new(workspace_bin("chorus-launcher", "chorus-run"))
            .args([
                "--keep-going",
                "--nproc-per-node",
                &world.to_string(),
                "--max-restarts",
                &restarts.to_string(),
                "--",
            ])
            .arg(env!("CARGO_BIN_EXE_chorus-test-rank"))
            .arg("grow")
            .env("FAULT_TIMEOUT_MS", TIMEOUT_MS.to_string())
            .env("FAULT_WINDOW_MS", "800")
            .env("FAULT_RANKS", list.join(","))
            .env("FAULT_ELEMS", elems.to_string())
            .env("FAULT_ADMITS", if restarts == 0 { "0" } else { "300" })
            .env("CHORUS_REJOIN_TIMEOUT_MS", "20000")
            .env(
                "CHORUS_TRACE_DIR",
                std::env::temp_dir().join("chorus-grow-traces"),
            ),
    );
    let mut out = Run::default();
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(line) => {
                let body = job_output::body(&line).to_string();
                let rank = field(&body, "rank").and_then(|v| v.parse::<usize>().ok());
                let at = field(&body, "at_ms").and_then(|v| v.parse::<u128>().ok());
                if body.starts_with("RESULT") {
                    let kind = field(&body, "kind").unwrap_or("").to_string();
                    let msg = body.split_once("msg=").map_or("", |(_, m)| m).to_string();
                    out.results.insert(rank.expect("rank"), (kind, msg));
                }
                if body.starts_with("REFORMED") {
                    out.reformed.push(
                        field(&body, "elapsed_ms")
                            .and_then(|v| v.parse().ok())
                            .expect("elapsed"),
                    );
                }
                if let (true, Some(r), Some(t)) = (body.starts_with("VICTIM"), rank, at) {
                    out.died_at.insert(r, t);
                }
                if let (true, Some(r), Some(t)) = (body.starts_with("FIRST_OP"), rank, at) {
                    out.first_op_at.insert(r, t);
                }
                if body.starts_with("VICTIM") || body.starts_with("PID") {
                    out.pids
                        .extend(field(&body, "pid").and_then(|v| v.parse::<i32>().ok()));
                }
                out.lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("no end within 40 s; output:\n{}", out.lines.join("\n"));
        }
    }
    let status = child.wait().expect("wait chorus-run");
    reader.join().expect("reader");
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join("chorus-grow-traces"));
    assert!(
        status.success() || restarts == 0,
        "chorus-run: {status}; output:\n{}",
        out.lines.join("\n")
    );
    for pid in &out.pids {
        let t = Instant::now();
        while alive(*pid) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!alive(*pid), "rank process {pid} leaked");
    }
    if let Ok(dir) = std::fs::read_dir("/dev/shm") {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(!name.contains("chorus"), "left in /dev/shm: {name}");
        }
    }
    out
}

/// Every rank grew back to the world, with one parameter hash; survivors
/// re-formed within the op timeout + 1 s.
fn assert_grown(out: &Run, world: usize, victims: &[usize]) {
    let dump = || out.lines.join("\n");
    assert_eq!(out.results.len(), world, "every rank reports:\n{}", dump());
    let mut hashes = Vec::new();
    for (r, (kind, msg)) in &out.results {
        assert_eq!(kind, "Grown", "rank {r}: {msg}\n{}", dump());
        assert!(msg.contains(&format!("size={world}")), "rank {r}: {msg}");
        hashes.push(field(msg, "params").expect("params").to_string());
    }
    hashes.dedup();
    assert_eq!(
        hashes.len(),
        1,
        "parameters differ: {:?}\n{}",
        out.results,
        dump()
    );
    assert_eq!(out.reformed.len(), world - victims.len(), "{}", dump());
    for ms in &out.reformed {
        assert!(
            *ms <= TIMEOUT_MS + 1000,
            "re-formed after {ms} ms\n{}",
            dump()
        );
    }
    for v in victims {
        let (d, f) = (out.died_at[v], out.first_op_at[v]);
        eprintln!(
            "world {world}: rank {v} died; its replacement's first op {} ms later",
            f.saturating_sub(d)
        );
    }
}

fn seeded() -> rand::rngs::StdRng {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    eprintln!("seed {seed}");
    rand::rngs::StdRng::seed_from_u64(seed)
}

const SMALL: usize = 1;
const LARGE: usize = 4 << 20;

#[test]
fn a_killed_non_zero_rank_rejoins() {
    let mut rng = seeded();
    for i in 0..runs() {
        // 3 and 4 ranks, 4 B and 16 MiB, in turn.
        let world = if i % 4 < 2 { 3 } else { 4 };
        let v = rng.gen_range(1..world);
        let elems = if i % 2 == 0 { SMALL } else { LARGE };
        assert_grown(&run(world, &[v], elems, 1), world, &[v]);
    }
}

#[test]
fn a_killed_rank_0_rejoins_after_the_survivors() {
    for i in 0..runs() {
        let elems = if i % 2 == 0 { LARGE } else { SMALL };
        let out = run(3, &[0], elems, 1);
        assert_grown(&out, 3, &[0]);
        // The replacement of world rank 0 takes the last rank.
        assert!(out.results[&0].1.contains("rank=2"), "{:?}", out.results);
    }
}

#[test]
fn two_ranks_killed_at_once_both_rejoin() {
    let mut rng = seeded();
    for i in 0..runs() {
        let a = rng.gen_range(0..4);
        let b = (a + rng.gen_range(1..4)) % 4;
        let mut vs = vec![a, b];
        vs.sort_unstable();
        let elems = if i % 2 == 0 { SMALL } else { LARGE };
        assert_grown(&run(4, &vs, elems, 2), 4, &vs);
    }
}

#[test]
fn without_restarts_two_killed_the_survivors_go_on_shrunk() {
    let out = run(4, &[1, 2], LARGE, 0);
    let dump = out.lines.join("\n");
    for r in [0, 3] {
        let (kind, msg) = &out.results[&r];
        assert_eq!(kind, "Shrunk", "rank {r}: {msg}\n{dump}");
        assert!(msg.contains("size=2"), "rank {r}: {msg}");
    }
    for ms in &out.reformed {
        assert!(*ms <= TIMEOUT_MS + 1000, "re-formed after {ms} ms\n{dump}");
    }
}
