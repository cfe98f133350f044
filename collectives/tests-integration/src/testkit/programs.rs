//! Programs the tests start that cargo does not build for them: binaries
//! of other workspace packages and the examples.

/// `target/<profile>` of the running test executable
/// (`target/<profile>/deps/<test>`).
fn profile_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .to_path_buf()
}

/// Runs `cargo build <args>` for the profile and target dir of the running
/// test executable.
///
/// # Panics
///
/// If the build fails: test helper only.
fn cargo_build(dir: &std::path::Path, args: &[&str]) {
    let profile = dir
        .file_name()
        .and_then(|p| p.to_str())
        .unwrap_or("debug")
        .to_string();
    let mut cmd =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.arg("build").args(args);
    if profile == "release" {
        cmd.arg("--release");
    } else if profile != "debug" {
        cmd.args(["--profile", &profile]);
    }
    if let Some(target) = dir.parent() {
        cmd.env("CARGO_TARGET_DIR", target);
    }
    let status = cmd.status().expect("run cargo");
    assert!(status.success(), "cargo build {} failed", args.join(" "));
}

/// Path of a binary of another workspace package (`chorus-run`,
/// `chorus-trace`) next to the running test executable, building it with
/// cargo if it is not there yet (cargo builds integration tests without the
/// other packages' binaries).
///
/// # Panics
///
/// If the binary cannot be built: test helper only.
pub fn workspace_bin(package: &str, name: &str) -> std::path::PathBuf {
    let dir = profile_dir();
    let path = dir.join(name);
    if !path.exists() {
        cargo_build(&dir, &["-p", package, "--bin", name]);
    }
    path
}

/// Path of example `name` of the `chorus-examples` package
/// (`target/<profile>/examples/<name>`), building it with cargo if it is
/// missing or older than its source (`cargo test` builds the examples, but
/// `cargo test --test X` does not, and integration tests get no
/// `CARGO_BIN_EXE_` for examples).
///
/// # Panics
///
/// If the example cannot be built: test helper only.
pub fn example_bin(name: &str) -> std::path::PathBuf {
    // The tests of one executable run in parallel: one build at a time.
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILD.lock().unwrap_or_else(|p| p.into_inner());
    let dir = profile_dir();
    let path = dir.join("examples").join(name);
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(format!("{name}.rs"));
    let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let stale = match (modified(&path), modified(&src)) {
        (None, _) => true,
        (Some(bin), Some(src)) => bin < src,
        (Some(_), None) => false,
    };
    if stale {
        cargo_build(&dir, &["-p", "chorus-examples", "--example", name]);
    }
    path
}

/// Runs example `name` with `args`, as a program that launches its own
/// ranks (the launcher variables of an enclosing job are removed, so it
/// does not take itself for a rank): its output and its stdout and stderr
/// as one text for assertion messages.
///
/// # Panics
///
/// If the example cannot be built or started: test helper only.
pub fn run_self_launching(name: &str, args: &[&str]) -> (std::process::Output, String) {
    let out = std::process::Command::new(example_bin(name))
        .args(args)
        .env_remove("RANK")
        .env_remove("SLURM_PROCID")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .output()
        .unwrap_or_else(|e| panic!("start {name}: {e}"));
    let text = format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}
