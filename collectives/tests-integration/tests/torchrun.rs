//! chorus programs under PyTorch's torchrun, which serves the workers' store
//! itself (its agent store): plain, `--standalone`, and with a restart.
//!
//! These need PyTorch: `CHORUS_TORCH_PYTHON` names a Python with it
//! (default `python3`); torchrun runs as `python -m torch.distributed.run`.
//! They are ignored by default; CI runs them with `--run-ignored only` after
//! installing PyTorch, and a missing PyTorch then fails them.
#![forbid(unsafe_code)]

use std::process::{Command, Output};

/// A port free now, for torchrun's agent store (torchrun hands the workers
/// `--master-port` as given, so 0 would not do).
fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port().to_string()
}

fn torchrun(args: &[&str], scenario: &str) -> Output {
    let python = std::env::var("CHORUS_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    Command::new(&python)
        .args(["-m", "torch.distributed.run"])
        .args(args)
        .arg("--no-python")
        .arg(env!("CARGO_BIN_EXE_chorus-test-rank"))
        .arg(scenario)
        .env("OMP_NUM_THREADS", "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python} -m torch.distributed.run: {e}"))
}

fn assert_ok(out: &Output, n: usize, line_start: impl Fn(usize) -> String) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stdout}\n{stderr}", out.status);
    for r in 0..n {
        assert!(
            stdout.lines().any(|l| l.starts_with(&line_start(r))),
            "rank {r} did not report {:?}:\n{stdout}\n{stderr}",
            line_start(r)
        );
    }
}

#[test]
#[ignore = "needs PyTorch (CHORUS_TORCH_PYTHON)"]
fn every_op_under_torchrun() {
    let port = free_port();
    let out = torchrun(&["--nproc-per-node", "3", "--master-port", &port], "matrix");
    assert_ok(&out, 3, |r| format!("OK rank={r} checks="));
}

#[test]
#[ignore = "needs PyTorch (CHORUS_TORCH_PYTHON)"]
fn every_op_under_torchrun_standalone() {
    let out = torchrun(&["--standalone", "--nproc-per-node", "2"], "matrix");
    assert_ok(&out, 2, |r| format!("OK rank={r} checks="));
}

#[test]
#[ignore = "needs PyTorch (CHORUS_TORCH_PYTHON)"]
fn restarted_workers_join_afresh() {
    let port = free_port();
    let out = torchrun(
        &[
            "--nproc-per-node",
            "3",
            "--master-port",
            &port,
            "--max-restarts",
            "1",
        ],
        "restart",
    );
    // 1 + 2 + 3 from every rank, in the second attempt.
    assert_ok(&out, 3, |r| format!("OK rank={r} attempt=1 sum=6"));
}
