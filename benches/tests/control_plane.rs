//! The control-plane harness itself at 512 simulated ranks in two
//! processes: every phase finishes (the binary fails otherwise), every
//! survivor finds the stopped rank silent and re-forms without it, and the
//! steady state costs at most two store requests per rank and period.

use std::process::Command;

#[test]
fn the_harness_runs_512_ranks_through_every_phase() {
    let out = Command::new(env!("CARGO_BIN_EXE_control_plane"))
        .args(["--ranks", "512", "--procs", "2", "--liveness-ms", "2000"])
        .args(["--periods", "10", "--phase-timeout-s", "50"])
        .output()
        .expect("run control_plane");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("{\"control_plane\""))
        .unwrap_or_else(|| panic!("no JSON line in {stdout}"));
    let v: serde_json::Value = serde_json::from_str(line).expect("JSON");
    let c = &v["control_plane"];
    assert_eq!(c["detect_found"], 511, "{line}");
    assert_eq!(c["detect_wrong"], 0, "{line}");
    assert_eq!(c["reformed"], 511, "{line}");
    let req = c["steady_requests_per_rank_period"]
        .as_f64()
        .expect("requests");
    // Two per rank and period; the window of ten periods can catch one
    // round more or less of a rank's at its edges.
    assert!(req > 1.7 && req <= 2.2, "{line}");
    let detect = c["detect_ms"].as_u64().expect("detect");
    assert!(detect >= 2_000, "found before the timeout: {line}");
}
