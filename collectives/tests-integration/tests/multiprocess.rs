//! Separate processes started by `chorus-run`: every op × dtype against the
//! serial reference for world sizes 1 to 5 (the same checks as `ops.rs`,
//! which runs ranks as tasks of one process).
#![forbid(unsafe_code)]

use std::process::Command;

use tests_integration::testkit::workspace_bin;

fn run_matrix(n: usize) {
    let out = Command::new(workspace_bin("chorus-launcher", "chorus-run"))
        .args(["--nproc-per-node", &n.to_string(), "--"])
        .arg(env!("CARGO_BIN_EXE_chorus-test-rank"))
        .arg("matrix")
        .output()
        .expect("start chorus-run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "world {n}: {:?}\n{stdout}\n{stderr}",
        out.status
    );
    for r in 0..n {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(&format!("[rank {r}] OK rank={r} checks="))),
            "rank {r} did not report OK:\n{stdout}\n{stderr}"
        );
    }
}

#[test]
fn every_op_in_separate_processes_world_1_to_5() {
    for n in 1..=5 {
        run_matrix(n);
    }
}
