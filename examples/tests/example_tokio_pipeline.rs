//! Smoke tests of `examples/tokio_pipeline.rs`: it launches its own ranks;
//! every rank must run the same rounds, and account for every record it
//! read (read == written + unwritten), after `--batches`, after a Ctrl-C
//! that reached one rank only, and with a slow sink or slow collectives.
#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tests_integration::testkit::example_bin;

fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(example_bin("tokio_pipeline"));
    cmd.args(args)
        .env_remove("RANK")
        .env_remove("SLURM_PROCID")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// The number `s` starts with.
fn leading_num(s: &str) -> Option<u64> {
    let digits: String = s.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// The number right after `key` in `line` (`key` ends with a space).
fn num_after(line: &str, key: &str) -> Option<u64> {
    leading_num(line.split(key).nth(1)?)
}

/// The line of rank `r` that contains `what` (lines carry a `[rank R] `
/// prefix from the launcher, then the example's own `rank R: `).
fn rank_line<'a>(text: &'a str, r: usize, what: &str) -> &'a str {
    let tag = format!("rank {r}: ");
    text.lines()
        .find(|l| l.contains(&tag) && l.contains(what))
        .unwrap_or_else(|| panic!("rank {r} printed no line with {what:?}:\n{text}"))
}

/// Checks every rank's accounting and returns the rounds they ran.
fn check_balanced(text: &str, world: usize) -> u64 {
    let mut rounds = None;
    for r in 0..world {
        let l = rank_line(text, r, ": read ");
        let read = num_after(l, ": read ").expect("read");
        let written = num_after(l, "= written ").expect("written");
        let unwritten = num_after(l, "+ unwritten ").expect("unwritten");
        assert_eq!(read, written + unwritten, "rank {r} lost records: {l}");
        assert!(written > 0, "rank {r} wrote nothing: {l}");
        assert!(l.ends_with("OK"), "{l}");

        let l = rank_line(text, r, " rounds (");
        let n = num_after(l, &format!("rank {r}: ")).expect("rounds");
        let results = num_after(l, "), ").expect("results written");
        let received = num_after(l, "sink received ").expect("sink count");
        assert_eq!(results, n, "rank {r}: every round's result is written: {l}");
        assert_eq!(received, n, "rank {r}: the sink got every result: {l}");
        match rounds {
            None => rounds = Some(n),
            Some(m) => assert_eq!(m, n, "ranks ran different numbers of rounds:\n{text}"),
        }
    }
    let summary = text
        .lines()
        .find(|l| l.contains(&format!("all {world} ranks: read ")))
        .unwrap_or_else(|| panic!("no summary:\n{text}"));
    assert!(summary.ends_with("every rank balanced: OK"), "{summary}");
    rounds.expect("world >= 1")
}

fn finish(child: Child) -> String {
    let out = child.wait_with_output().expect("wait for tokio_pipeline");
    let text = format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{:?}\n{text}", out.status);
    text
}

/// `up to N <what>` in `line`.
fn up_to(line: &str, what: &str) -> u64 {
    line.split("up to ")
        .find(|s| s.split_whitespace().nth(1) == Some(what))
        .and_then(leading_num)
        .unwrap_or_else(|| panic!("no 'up to N {what}' in {line}"))
}

#[test]
fn quick_run_balances_on_three_ranks() {
    let text = finish(
        command(&["--nproc", "3", "--quick"])
            .spawn()
            .expect("start tokio_pipeline"),
    );
    assert_eq!(check_balanced(&text, 3), 20, "{text}");
    assert!(
        text.contains("stopped after round 19 (--batches)"),
        "{text}"
    );
    // The per-round results carry the all_gather of every rank's count.
    assert!(
        text.lines()
            .any(|l| l.contains("round 10: 96 records from [32, 32, 32]")),
        "{text}"
    );
}

/// Who gets the SIGINT.
#[derive(Clone, Copy)]
enum Target {
    /// Rank 1 only: the others must learn it through the stop flag.
    Rank1,
    /// The launcher (the example's own process), as a Ctrl-C in a terminal:
    /// it forwards SIGINT to every rank.
    Launcher,
}

/// Runs the pipeline on 3 ranks until Ctrl-C, sends SIGINT to `target`
/// once some rounds went through, and returns the exit status and output.
fn interrupted(target: Target) -> (std::process::ExitStatus, String) {
    let mut child = command(&["--nproc", "3", "--report-ms", "0", "--print-every", "1"])
        .spawn()
        .expect("start tokio_pipeline");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            all.push_str(&line);
            all.push('\n');
            let _ = tx.send(line);
        }
        all
    });
    // Wait for rank 1's pid and for some rounds to go through.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut pid, mut rounds) = (None, 0);
    while pid.is_none() || rounds < 5 {
        let line = rx
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the pipeline printed its pids and rounds in time");
        if let Some(p) = line.split("rank 1: pid ").nth(1) {
            pid = leading_num(p);
        }
        if line.contains("] round ") {
            rounds += 1;
        }
    }
    let pid = match target {
        Target::Rank1 => pid.expect("rank 1's pid"),
        Target::Launcher => child.id() as u64,
    };
    let status = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -INT {pid} failed");
    let stderr = child.stderr.take();
    let status = child.wait().expect("wait for tokio_pipeline");
    let mut text = reader.join().expect("reader thread");
    if let Some(mut e) = stderr {
        text.push_str("\n--- stderr ---\n");
        std::io::Read::read_to_string(&mut e, &mut text).ok();
    }
    (status, text)
}

/// Every rank stopped after the same round, agreed through the stop flag.
fn check_agreed_stop(text: &str) {
    let rounds = check_balanced(text, 3);
    assert!(rounds >= 5, "{text}");
    assert!(
        text.contains(&format!(
            "stopped after round {} (stop flag agreed through all_reduce)",
            rounds - 1
        )),
        "{text}"
    );
}

#[test]
fn ctrl_c_on_one_rank_stops_every_rank_at_the_same_round() {
    let (status, text) = interrupted(Target::Rank1);
    assert!(status.success(), "{status:?}\n{text}");
    assert!(rank_line(&text, 1, "Ctrl-C").contains("raising the stop flag"));
    check_agreed_stop(&text);
}

#[test]
fn ctrl_c_on_the_launcher_stops_every_rank_cleanly() {
    let (status, text) = interrupted(Target::Launcher);
    // Every rank exits 0; the launcher reports that it was interrupted.
    assert_eq!(status.code(), Some(130), "{status:?}\n{text}");
    assert!(!text.contains("failed"), "{text}");
    // (A rank whose SIGINT arrives once the ranks have agreed may already
    // be past its loop and print nothing about it.)
    assert!(
        text.contains(": Ctrl-C: "),
        "no rank saw the Ctrl-C:\n{text}"
    );
    check_agreed_stop(&text);
}

#[test]
fn a_slow_sink_or_slow_collectives_only_stall_up_to_the_queue_bound() {
    // Slow sink: the collectives keep going until the results queue (2) and
    // the result being written are full.
    let text = finish(
        command(&[
            "--nproc",
            "2",
            "--quick",
            "--batches",
            "10",
            "--queue",
            "2",
            "--slow-sink-ms",
            "80",
        ])
        .spawn()
        .expect("start tokio_pipeline"),
    );
    check_balanced(&text, 2);
    for r in 0..2 {
        let l = rank_line(&text, r, "stages:");
        let lead = up_to(l, "results");
        assert!(
            (2..=3).contains(&lead),
            "rank {r}: collectives ran {lead} results ahead of the slow sink, expected up to the bound 2 + 1: {l}"
        );
    }

    // Slow collectives: the reader keeps reading until the batch queue (3)
    // is full; the window (2) fills up.
    let text = finish(
        command(&[
            "--nproc",
            "2",
            "--quick",
            "--batches",
            "10",
            "--queue",
            "3",
            "--window",
            "2",
            "--slow-reduce-ms",
            "80",
        ])
        .spawn()
        .expect("start tokio_pipeline"),
    );
    check_balanced(&text, 2);
    for r in 0..2 {
        let l = rank_line(&text, r, "stages:");
        let lead = up_to(l, "batches");
        assert_eq!(
            lead, 3,
            "rank {r}: the reader should fill the queue of 3 while the collectives are slow: {l}"
        );
        assert_eq!(up_to(l, "rounds"), 2, "rank {r}: window of 2: {l}");
    }
}
