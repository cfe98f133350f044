//! chorus across hosts: jobs of several `chorus-run`s, one per test host
//! (network namespaces joined by a switch, see `tests_integration::netns`),
//! with real TCP between the hosts and Unix sockets and shared memory
//! inside each.
//!
//! Needs root (network namespaces): ignored by default, run with
//! `--run-ignored only` (CI does). Without the privileges a test fails and
//! says why. Every test checks that nothing of its hosts is left behind.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tests_integration::netns::{leftovers, outputs, Hosts, Output};
use tests_integration::testkit::workspace_bin;

/// The liveness timeout the partition tests run with.
const LIVENESS_S: u64 = 3;

fn hosts(k: usize) -> Hosts {
    Hosts::new(k).unwrap_or_else(|e| panic!("{e}"))
}

/// Starts `chorus-run --nnodes K --node-rank I ... -- chorus-test-rank
/// SCENARIO` in every host; node 0's address given as `master` (a host name
/// or an address). Returns each node's process id in `h` and its output.
fn start_job(
    h: &mut Hosts,
    nproc: usize,
    master: &str,
    scenario: &str,
    env: &[(&str, &str)],
) -> Vec<(usize, Output)> {
    let run = workspace_bin("chorus-launcher", "chorus-run");
    let rank = std::path::PathBuf::from(env!("CARGO_BIN_EXE_chorus-test-rank"));
    start_program(
        h,
        &run,
        nproc,
        master,
        &[rank.to_string_lossy().as_ref(), scenario],
        env,
    )
}

/// [`start_job`] with any rank program and `chorus-run` given.
fn start_program(
    h: &mut Hosts,
    run: &std::path::Path,
    nproc: usize,
    master: &str,
    program: &[&str],
    env: &[(&str, &str)],
) -> Vec<(usize, Output)> {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    (0..h.len())
        .map(|i| {
            let args: Vec<String> = [
                "--nnodes",
                &h.len().to_string(),
                "--node-rank",
                &i.to_string(),
                "--nproc-per-node",
                &nproc.to_string(),
                "--master-addr",
                master,
                "--master-port",
                "29611",
                "--",
            ]
            .iter()
            .chain(program)
            .map(|s| s.to_string())
            .collect();
            h.spawn(i, run, &args, &env)
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect()
}

fn epoch_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Waits until every rank of a 2 × 2 `loop` job printed its first round.
fn all_going(nodes: &[(usize, Output)]) {
    for r in 0..4 {
        let (_, out) = &nodes[r / 2];
        assert!(
            out.wait_for(&format!("LOOP rank={r} iter="), Duration::from_secs(60)),
            "rank {r} never got going:\n{}",
            outputs(nodes)
        );
    }
}

/// After a job: no process is left in any host, and once the hosts are
/// gone no namespace of this test either.
fn assert_nothing_left(h: Hosts, log: &str) {
    for i in 0..h.len() {
        let t0 = Instant::now();
        while !h.pids_in(i).is_empty() && t0.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            h.pids_in(i).is_empty(),
            "processes left in host {i}: {:?}\n{log}",
            h.pids_in(i)
        );
    }
    let names: Vec<String> = (0..h.len()).map(|i| h.name(i)).collect();
    drop(h);
    let left = leftovers(true);
    assert!(
        names.iter().all(|n| !left.contains(n)),
        "namespaces left behind: {left:?}"
    );
}

#[test]
#[ignore = "needs root (network namespaces)"]
fn the_harness_makes_hosts_that_reach_each_other_and_removes_them() {
    let mut h = hosts(2);
    // Host names resolve inside each host, and the link carries packets:
    // a connection to a closed port of host 1 is refused (by host 1).
    let bash = std::path::PathBuf::from("/bin/bash");
    let (id, out) = h
        .spawn(
            0,
            &bash,
            &[
                "-c".into(),
                "getent hosts node1; (echo > /dev/tcp/node1/9) 2>&1".into(),
            ],
            &[],
        )
        .unwrap();
    let st = h.wait(id, Duration::from_secs(10)).expect("bash ends");
    let text = out.text();
    assert!(
        text.contains("10.77.0.2") && text.contains("node1") && text.contains("refused"),
        "{st:?}: {text}"
    );
    let names = [h.name(0), h.name(1)];
    drop(h);
    let left = leftovers(true);
    assert!(names.iter().all(|n| !left.contains(n)), "{left:?}");
}

fn every_op_across_hosts(k: usize, nproc: usize, master: &str) {
    let mut h = hosts(k);
    let nodes = start_job(&mut h, nproc, master, "hosts", &[]);
    let mut codes = Vec::new();
    for (id, _) in &nodes {
        codes.push(h.wait(*id, Duration::from_secs(240)));
    }
    let log = outputs(&nodes);
    assert!(
        codes.iter().all(|c| c.is_some_and(|s| s.success())),
        "{codes:?}\n{log}"
    );
    for r in 0..k * nproc {
        assert!(
            log.lines()
                .any(|l| l.contains(&format!("OK rank={r} checks="))),
            "rank {r} did not report OK:\n{log}"
        );
    }
    assert_nothing_left(h, &log);
}

#[test]
#[ignore = "needs root (network namespaces)"]
fn every_op_across_2_hosts_of_2_ranks_master_by_name() {
    every_op_across_hosts(2, 2, "node0");
}

#[test]
#[ignore = "needs root (network namespaces)"]
fn every_op_across_3_hosts_of_1_rank() {
    every_op_across_hosts(3, 1, "10.77.0.1");
}

/// Runs a 2 × 2 job of 16 MiB all_reduces until every rank is busy, then
/// `fault(hosts, node pids)`; every launcher must exit non-zero within the
/// liveness timeout and `slack`, with no process left. Returns how long
/// after the fault each node's launcher exited, and the log.
fn fault_mid_all_reduce(
    fault: impl FnOnce(&Hosts, &[u32]),
    slack: Duration,
) -> (Vec<Duration>, String) {
    let mut h = hosts(2);
    let live = LIVENESS_S.to_string();
    let nodes = start_job(
        &mut h,
        2,
        "node0",
        "loop",
        &[("CHORUS_LIVENESS_TIMEOUT_S", &live), ("LOOP_SECS", "120")],
    );
    all_going(&nodes);
    let pids: Vec<u32> = nodes.iter().filter_map(|(id, _)| h.pid(*id)).collect();
    let t_fault = Instant::now();
    let at_ms = epoch_ms();
    fault(&h, &pids);
    let bound = Duration::from_secs(LIVENESS_S) + slack;
    let mut took = Vec::new();
    for (i, (id, _)) in nodes.iter().enumerate() {
        let st = h.wait(*id, bound.saturating_sub(t_fault.elapsed()));
        let log = outputs(&nodes);
        let st =
            st.unwrap_or_else(|| panic!("node {i} still runs {bound:?} after the fault:\n{log}"));
        took.push(t_fault.elapsed());
        assert!(
            !st.success(),
            "node {i}'s launcher exited with {st:?}:\n{log}"
        );
    }
    let log = format!("fault at_ms={at_ms}\n{}", outputs(&nodes));
    assert_nothing_left(h, &log);
    (took, log)
}

#[test]
#[ignore = "needs root (network namespaces)"]
fn a_partition_mid_all_reduce_fails_every_rank_within_the_liveness_timeout() {
    let (took, log) = fault_mid_all_reduce(
        |h, _| h.cut(1).expect("cut host 1 off"),
        Duration::from_secs(3),
    );
    // Each side names the silent link (ranks killed by their launcher after
    // the first failure print nothing).
    for node in 0..2 {
        let ranks = [2 * node, 2 * node + 1];
        assert!(
            log.lines().any(|l| ranks
                .iter()
                .any(|r| l.contains(&format!("RESULT rank={r} kind=PeerSilent")))),
            "no rank of node {node} reported the silent link:\n{log}"
        );
    }
    println!("partition: launchers exited {took:?} after the cut (liveness {LIVENESS_S} s)\n{log}");
}

#[test]
#[ignore = "needs root (network namespaces)"]
fn a_killed_launcher_ends_the_job_on_every_node() {
    let (took, log) = fault_mid_all_reduce(
        |_, pids| {
            let pid = nix::unistd::Pid::from_raw(pids[1] as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL)
                .expect("kill node 1's chorus-run");
        },
        Duration::from_secs(3),
    );
    assert!(
        log.lines()
            .any(|l| l.contains("RESULT rank=0 kind=") || l.contains("RESULT rank=1 kind=")),
        "no rank of node 0 reported the lost peers:\n{log}"
    );
    println!("killed launcher: launchers exited {took:?} after the kill\n{log}");
}

#[test]
#[ignore = "needs root (network namespaces)"]
fn after_a_partition_the_host_that_reaches_the_store_re_forms_and_goes_on() {
    // Node 0 serves the store; node 1 is cut off mid 16 MiB all_reduce.
    // Node 0's ranks fail on the silent link, re-form as a group of two
    // and check ops on it; node 1's cannot reach the store and fail.
    let mut h = hosts(2);
    let live = LIVENESS_S.to_string();
    let nodes = start_job(
        &mut h,
        2,
        "node0",
        "loop-reform",
        &[
            ("CHORUS_LIVENESS_TIMEOUT_S", &live),
            ("REFORM_WINDOW_MS", "2000"),
        ],
    );
    all_going(&nodes);
    let t_cut = Instant::now();
    h.cut(1).expect("cut host 1 off");
    // Liveness, the re-form's window and its grace, and slack.
    let bound = Duration::from_secs(LIVENESS_S + 2 + 1 + 5);
    let st = h.wait(nodes[0].0, bound);
    let log = outputs(&nodes);
    let st = st.unwrap_or_else(|| panic!("node 0 still runs {bound:?} after the cut:\n{log}"));
    let reformed = t_cut.elapsed();
    assert!(st.success(), "node 0's launcher exited with {st:?}:\n{log}");
    for r in 0..2 {
        assert!(
            log.contains(&format!(
                "REFORMED rank={r} new_rank={r} size=2 epoch=1 members=[0, 1]"
            )),
            "rank {r} did not re-form with rank {}:\n{log}",
            1 - r
        );
    }
    let bound = Duration::from_secs(LIVENESS_S + 30);
    let st = h.wait(nodes[1].0, bound.saturating_sub(t_cut.elapsed()));
    let log = outputs(&nodes);
    let st = st.unwrap_or_else(|| panic!("node 1 still runs {bound:?} after the cut:\n{log}"));
    assert!(
        !st.success(),
        "node 1's launcher exited with {st:?}:\n{log}"
    );
    println!(
        "partition then re-form: node 0 re-formed and exited {reformed:?} after the cut, node 1 failed after {:?}\n{log}",
        t_cut.elapsed()
    );
    assert_nothing_left(h, &log);
}
