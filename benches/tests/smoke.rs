//! CI smoke run of the benchmark harness: `chorus-bench --quick` must
//! finish in seconds without torch or a GPU, and write the report tables and
//! the plots. Figures are not checked (no timed assertions); only that the
//! harness still runs end to end.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A binary of another package of the workspace, built into the same
/// target folder as this test when it is missing.
fn workspace_bin(package: &str, name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf();
    let path = dir.join(name);
    if !path.exists() {
        let profile = dir
            .file_name()
            .and_then(|p| p.to_str())
            .unwrap_or("debug")
            .to_string();
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args(["build", "-p", package, "--bin", name]);
        if profile == "release" {
            cmd.arg("--release");
        } else if profile != "debug" {
            cmd.args(["--profile", &profile]);
        }
        if let Some(target) = dir.parent() {
            cmd.env("CARGO_TARGET_DIR", target);
        }
        let status = cmd.status().expect("run cargo");
        assert!(
            status.success(),
            "cargo build -p {package} --bin {name} failed"
        );
    }
    path
}

#[test]
fn quick_run_writes_tables_and_plots() {
    // chorus-bench runs its siblings: this package's binaries are built
    // for its tests; chorus-run belongs to chorus-launcher.
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_chorus-bench"));
    let launcher = workspace_bin("chorus-launcher", "chorus-run");
    assert_eq!(bench.parent(), launcher.parent(), "one target folder");

    let tmp = std::env::temp_dir().join(format!("chorus-bench-smoke-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).expect("temp dir");
    let out = tmp.join("RESULTS.md");
    let plots = tmp.join("plots");
    // A hand-written section, and a GPU section this machine may not
    // rewrite, that must survive the run.
    let gpu_section = if std::process::Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        ""
    } else {
        "<!-- chorus-bench:nccl:begin -->\nan earlier GPU run\n<!-- chorus-bench:nccl:end -->\n"
    };
    std::fs::write(
        &out,
        format!("# Results\n\n## Hand written\n\nkeep me\n\n{gpu_section}"),
    )
    .expect("seed report");

    let mut child = Command::new(&bench)
        .args(["--quick", "--no-torch", "--reps", "1", "--out"])
        .arg(&out)
        .arg("--plots")
        .arg(&plots)
        .spawn()
        .expect("start chorus-bench");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for chorus-bench") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chorus-bench --quick did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "chorus-bench --quick failed: {status}");

    let md = std::fs::read_to_string(&out).expect("report written");
    assert!(md.contains("keep me"), "hand-written section kept:\n{md}");
    assert!(
        md.contains(gpu_section),
        "the GPU section is left as it was:\n{md}"
    );
    for want in [
        "<!-- chorus-bench:store:begin -->",
        "<!-- chorus-bench:store:end -->",
        "<!-- chorus-bench:tcp:begin -->",
        "<!-- chorus-bench:checked:end -->",
        "Measured ",
        " at commit `",
        "--quick",
        "## Store",
        "| op | chorus clients × in flight | ours ops/s | ÷ floor | PyTorch ops/s | ratio | target | met |",
        "| set | 1 × 1 |",
        "## TCP backend beside Gloo: all_reduce f32",
        "| 2 | 4 B |",
        "| 2 | 64 KiB |",
        "Gloo anchor skipped (2 ranks): --no-torch given",
        "### On the TCP backend",
        "| 2 | broadcast | 4 B |",
        "| 2 | all_reduce | 4 KiB |",
    ] {
        assert!(md.contains(want), "report lacks {want:?}:\n{md}");
    }
    for name in [
        "tcp_allreduce_latency_2ranks.svg",
        "tcp_allreduce_busbw_2ranks.svg",
    ] {
        let svg = std::fs::read_to_string(plots.join(name)).expect("plot written");
        assert!(
            svg.contains("<svg") && svg.contains("chorus"),
            "{name} is a plot"
        );
        assert!(md.contains(&format!("plots/{name}")), "report links {name}");
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
