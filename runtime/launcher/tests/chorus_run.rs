//! The chorus-run launcher, with `sh` scripts as ranks: environment, output
//! prefixes, failure propagation, stopping the other ranks, signals.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::{Rng, SeedableRng};

const CHORUS_RUN: &str = env!("CARGO_BIN_EXE_chorus-run");

/// Upper bound on any launcher run, so a broken launcher fails the test
/// instead of hanging it.
const GUARD: Duration = Duration::from_secs(30);

fn launcher(args: &[&str]) -> Command {
    let mut c = Command::new(CHORUS_RUN);
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Reads a pipe to its end on a thread.
fn read_all(mut r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    rx
}

/// Waits for `child` (at most GUARD; killed and panics after that).
fn wait(mut child: Child) -> ExitStatus {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(GUARD) {
        Ok(st) => st.unwrap(),
        Err(_) => {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            panic!("chorus-run did not finish within {GUARD:?}");
        }
    }
}

struct Output {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str]) -> Output {
    let mut child = launcher(args).spawn().unwrap();
    let out = read_all(child.stdout.take().unwrap());
    let err = read_all(child.stderr.take().unwrap());
    let st = wait(child);
    Output {
        code: st.code(),
        stdout: out.recv_timeout(GUARD).unwrap(),
        stderr: err.recv_timeout(GUARD).unwrap(),
    }
}

/// Whether `pid` is gone (or a zombie left to init).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

/// `(rank, rest)` of a `[rank R] rest` line.
fn split_prefix(line: &str) -> (u32, &str) {
    let rest = line
        .strip_prefix("[rank ")
        .unwrap_or_else(|| panic!("no prefix: {line:?}"));
    let (r, rest) = rest.split_once("] ").unwrap();
    (r.parse().unwrap(), rest)
}

/// Pids printed by ranks as `pid <rank> <pid>` lines.
fn pids(stdout: &str) -> Vec<i32> {
    stdout
        .lines()
        .filter_map(|l| {
            l.split_once("] pid ")
                .map(|(_, p)| p.trim().parse().unwrap())
        })
        .collect()
}

#[test]
fn ranks_get_the_torchrun_environment() {
    let o = run(&[
        "--nproc-per-node",
        "3",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        "29999",
        "--",
        "sh",
        "-c",
        "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $GROUP_WORLD_SIZE $MASTER_ADDR $MASTER_PORT",
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let mut got: Vec<&str> = o.stdout.lines().collect();
    got.sort();
    assert_eq!(
        got,
        [
            "[rank 3] 3 6 0 3 1 2 127.0.0.1 29999",
            "[rank 4] 4 6 1 3 1 2 127.0.0.1 29999",
            "[rank 5] 5 6 2 3 1 2 127.0.0.1 29999",
        ]
    );
}

#[test]
fn share_gpu_gives_every_rank_the_one_gpu_and_a_host_of_its_own() {
    let o = run(&[
        "--nproc-per-node",
        "3",
        "--share-gpu",
        "--",
        "sh",
        "-c",
        "echo $RANK $LOCAL_RANK $LOCAL_WORLD_SIZE $CUDA_VISIBLE_DEVICES $NCCL_HOSTID $NCCL_SOCKET_IFNAME $NCCL_IB_DISABLE $CHORUS_SHARE_GPU",
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let mut got: Vec<&str> = o.stdout.lines().map(|l| split_prefix(l).1).collect();
    got.sort();
    assert_eq!(
        got,
        [
            "0 0 3 0 chorus-shared-gpu-rank0 lo 1 1",
            "1 0 3 0 chorus-shared-gpu-rank1 lo 1 1",
            "2 0 3 0 chorus-shared-gpu-rank2 lo 1 1",
        ]
    );
    // Said once, before the ranks start, that the figures mean nothing.
    let warned: Vec<&str> = o
        .stderr
        .lines()
        .filter(|l| l.contains("--share-gpu") && l.contains("timings mean nothing"))
        .collect();
    assert_eq!(warned.len(), 1, "{}", o.stderr);

    // --gpu picks from the inherited visible devices.
    let mut c = launcher(&[
        "--nproc-per-node",
        "2",
        "--share-gpu",
        "--gpu",
        "1",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES",
    ]);
    c.env("CUDA_VISIBLE_DEVICES", "3,5");
    let child = c.spawn().unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| split_prefix(l).1.to_string())
        .collect();
    assert_eq!(lines, ["5", "5"]);
}

#[test]
fn single_node_default_master_is_loopback_with_a_port() {
    let o = run(&[
        "--nproc-per-node",
        "2",
        "sh",
        "-c",
        "echo $MASTER_ADDR:$MASTER_PORT",
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    let lines: Vec<&str> = o.stdout.lines().map(|l| split_prefix(l).1).collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0], lines[1], "every rank must see the same master");
    let port: u16 = lines[0]
        .strip_prefix("127.0.0.1:")
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(port, 0);
}

#[test]
fn every_line_is_prefixed_and_whole() {
    // Long random lines from 4 ranks at once, on stdout and stderr; each
    // must come out whole, in order, under its own rank.
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let payload: String = (0..3000).map(|_| rng.gen_range('a'..='z')).collect();
    let script = r#"i=0; while [ $i -lt 40 ]; do echo "$RANK $i $1"; echo "err $RANK $i" >&2; i=$((i+1)); done; printf "tail $RANK""#;
    let o = run(&[
        "--nproc-per-node",
        "4",
        "--",
        "sh",
        "-c",
        script,
        "sh",
        &payload,
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);

    let mut next: BTreeMap<u32, usize> = BTreeMap::new();
    let mut tails = Vec::new();
    for line in o.stdout.lines() {
        let (rank, rest) = split_prefix(line);
        if let Some(t) = rest.strip_prefix("tail ") {
            tails.push((rank, t.to_string()));
            continue;
        }
        let i = next.entry(rank).or_insert(0);
        assert_eq!(
            rest,
            format!("{rank} {i} {payload}"),
            "line of rank {rank} cut or mixed"
        );
        *i += 1;
    }
    assert_eq!(next, (0..4).map(|r| (r, 40)).collect());
    // The last line without a newline still comes out, terminated.
    tails.sort();
    assert_eq!(
        tails,
        (0..4).map(|r| (r, r.to_string())).collect::<Vec<_>>()
    );

    let mut next: BTreeMap<u32, usize> = BTreeMap::new();
    for line in o.stderr.lines().filter(|l| l.starts_with("[rank ")) {
        let (rank, rest) = split_prefix(line);
        let i = next.entry(rank).or_insert(0);
        assert_eq!(rest, format!("err {rank} {i}"));
        *i += 1;
    }
    assert_eq!(next, (0..4).map(|r| (r, 40)).collect());
}

#[test]
fn a_failing_rank_stops_the_others_and_sets_the_exit_code() {
    // Rank 2 fails with 7 once the others are up; rank 0 sleeps forever
    // (and has a child of its own), rank 1 ignores SIGTERM and has to be
    // SIGKILLed after --kill-timeout.
    let script = r#"
        echo "pid $$"
        case $RANK in
          0) sleep 1000 & echo "pid $!"; wait ;;
          1) trap '' TERM; while true; do sleep 0.05; done ;;
          2) sleep 0.3; exit 7 ;;
        esac"#;
    let o = run(&[
        "--nproc-per-node",
        "3",
        "--kill-timeout",
        "0.5",
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert_eq!(
        o.code,
        Some(7),
        "stdout:\n{}\nstderr:\n{}",
        o.stdout,
        o.stderr
    );
    assert!(
        o.stderr
            .contains("rank 2 exited with code 7; stopping the other ranks"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("sending SIGKILL"), "{}", o.stderr);
    let pids = pids(&o.stdout);
    assert_eq!(pids.len(), 4, "{}", o.stdout);
    for pid in pids {
        assert!(gone(pid), "process {pid} survived chorus-run");
    }
}

#[test]
fn a_rank_killed_by_a_signal_gives_128_plus_the_signal() {
    let o = run(&[
        "--nproc-per-node",
        "2",
        "sh",
        "-c",
        r#"if [ $RANK = 1 ]; then kill -s KILL $$; fi; exec sleep 1000"#,
    ]);
    assert_eq!(o.code, Some(128 + 9), "{}", o.stderr);
    assert!(
        o.stderr.contains("rank 1 was killed by signal 9 (SIGKILL)"),
        "{}",
        o.stderr
    );
}

#[test]
fn a_missing_program_gives_127() {
    let o = run(&[
        "--nproc-per-node",
        "2",
        "--",
        "/nonexistent/chorus-test-program",
    ]);
    assert_eq!(o.code, Some(127), "{}", o.stderr);
    assert!(o.stderr.contains("cannot start rank 0"), "{}", o.stderr);
}

#[test]
fn bad_arguments_give_2() {
    let o = run(&["--nproc-per-node", "2", "--nnodes", "2", "--", "true"]);
    assert_eq!(o.code, Some(2));
    assert!(
        o.stderr.contains("--master-addr is required"),
        "{}",
        o.stderr
    );
}

/// Starts 3 ranks that report `ready`, their pid and their child's, sends `sig` to
/// chorus-run, and checks every rank got it.
fn forwards(sig: Signal, name: &str) {
    let script = format!(
        r#"trap 'echo "got {name}"; exit 0' {name}; echo "pid $$"; sleep 1000 & echo "pid $!"; echo ready; wait"#
    );
    let mut child = launcher(&["--nproc-per-node", "3", "--", "sh", "-c", &script])
        .spawn()
        .unwrap();
    let err = read_all(child.stderr.take().unwrap());
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut seen = Vec::new();
    let mut line = String::new();
    while seen
        .iter()
        .filter(|l: &&String| l.ends_with("] ready\n"))
        .count()
        < 3
    {
        line.clear();
        assert_ne!(
            out.read_line(&mut line).unwrap(),
            0,
            "output ended early: {seen:?}"
        );
        seen.push(line.clone());
    }
    kill(Pid::from_raw(child.id() as i32), sig).unwrap();
    let out = read_all(out);
    let st = wait(child);
    let stdout = seen.concat() + &out.recv_timeout(GUARD).unwrap();
    let stderr = err.recv_timeout(GUARD).unwrap();
    // No rank failed: chorus-run reports the signal it got.
    assert_eq!(st.code(), Some(128 + sig as i32), "{stdout}\n{stderr}");
    for r in 0..3 {
        assert!(
            stdout.contains(&format!("[rank {r}] got {name}\n")),
            "{stdout}\n{stderr}"
        );
    }
    // The ranks and their children (a background child of `sh` ignores
    // SIGINT: chorus-run stops it when its rank exits).
    let pids = pids(&stdout);
    assert_eq!(pids.len(), 6, "{stdout}");
    for pid in pids {
        assert!(gone(pid), "process {pid} survived chorus-run");
    }
}

#[test]
fn sigterm_is_forwarded_to_every_rank() {
    forwards(Signal::SIGTERM, "TERM");
}

#[test]
fn sigint_is_forwarded_to_every_rank() {
    forwards(Signal::SIGINT, "INT");
}

#[test]
fn sighup_is_forwarded_to_every_rank() {
    forwards(Signal::SIGHUP, "HUP");
}

#[test]
fn a_second_signal_kills_at_once() {
    // The ranks ignore SIGTERM; the second SIGTERM must not wait for the
    // (long) kill timeout.
    let script = r#"trap '' TERM; echo "pid $$"; echo ready; while true; do sleep 0.05; done"#;
    let mut child = launcher(&[
        "--nproc-per-node",
        "2",
        "--kill-timeout",
        "600",
        "--",
        "sh",
        "-c",
        script,
    ])
    .spawn()
    .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    while seen.matches("] ready\n").count() < 2 {
        assert_ne!(
            out.read_line(&mut seen).unwrap(),
            0,
            "output ended early: {seen}"
        );
    }
    let pid = Pid::from_raw(child.id() as i32);
    kill(pid, Signal::SIGTERM).unwrap();
    // Send the second one once chorus-run has handled the first.
    let mut stderr = String::new();
    while !stderr.contains("got SIGTERM") {
        assert_ne!(
            err.read_line(&mut stderr).unwrap(),
            0,
            "stderr ended early: {stderr}"
        );
    }
    kill(pid, Signal::SIGTERM).unwrap();
    let err = read_all(err);
    let st = wait(child);
    let stderr = stderr + &err.recv_timeout(GUARD).unwrap();
    assert_eq!(st.code(), Some(128 + 9), "{stderr}");
    assert!(
        stderr.contains("SIGTERM again; killing every rank"),
        "{stderr}"
    );
    let rest = read_all(out).recv_timeout(GUARD).unwrap();
    for pid in pids(&(seen + &rest)) {
        assert!(gone(pid), "process {pid} survived chorus-run");
    }
}

#[test]
fn max_restarts_restarts_a_failed_rank_in_place_and_leaves_the_others_alone() {
    // Rank 1 fails on its first start (killed by a signal) and on its
    // first restart (code 3), then succeeds; rank 0 runs through once,
    // long enough to see both restarts.
    let script = r#"
        echo "start rank=$RANK restarts=$CHORUS_RANK_RESTARTS pid=$$"
        case "$RANK:$CHORUS_RANK_RESTARTS" in
          1:0) sleep 0.1; kill -9 $$ ;;
          1:1) sleep 0.1; exit 3 ;;
          1:*) echo "rank 1 done" ;;
          0:*) sleep 1.5; echo "rank 0 done" ;;
        esac"#;
    let o = run(&[
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "2",
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert_eq!(
        o.code,
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        o.stdout,
        o.stderr
    );
    let starts: Vec<&str> = o
        .stdout
        .lines()
        .filter(|l| l.contains("] start "))
        .collect();
    let of = |r: u32| starts.iter().filter(|l| split_prefix(l).0 == r).count();
    assert_eq!(of(0), 1, "rank 0 must not be restarted:\n{}", o.stdout);
    assert_eq!(of(1), 3, "{}", o.stdout);
    for k in 0..3 {
        assert!(
            o.stdout.contains(&format!("start rank=1 restarts={k} ")),
            "{}",
            o.stdout
        );
    }
    assert!(o.stdout.contains("rank 0 done") && o.stdout.contains("rank 1 done"));
    assert!(
        o.stderr
            .contains("rank 1 was killed by signal 9 (SIGKILL); restarting it in place"),
        "{}",
        o.stderr
    );
    assert!(
        o.stderr
            .contains("rank 1 exited with code 3; restarting it in place"),
        "{}",
        o.stderr
    );
}

#[test]
fn a_rank_that_fails_past_max_restarts_stops_the_job() {
    let script = r#"
        case $RANK in
          0) sleep 1000 ;;
          1) sleep 0.1; exit 5 ;;
        esac"#;
    let o = run(&[
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--kill-timeout",
        "0.5",
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert_eq!(
        o.code,
        Some(5),
        "stdout:\n{}\nstderr:\n{}",
        o.stdout,
        o.stderr
    );
    assert!(
        o.stderr
            .contains("restarting it in place (restart 1 of this rank, 0 left on this node)"),
        "{}",
        o.stderr
    );
    assert!(
        o.stderr
            .contains("rank 1 exited with code 5; stopping the other ranks"),
        "{}",
        o.stderr
    );
}
