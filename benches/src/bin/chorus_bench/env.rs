//! Where the bench programs and PyTorch scripts are, and what this machine
//! has (PyTorch, a GPU).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::child::run;

pub(crate) const BUILD_HINT: &str = "cargo build --release -p chorus-benches -p chorus-launcher";

/// Where the helpers are.
#[derive(Debug)]
pub(crate) struct Env {
    pub(crate) bin_dir: PathBuf,
    pub(crate) compare_dir: PathBuf,
    /// `Some(version)` when `import torch` works and torch is not refused.
    pub(crate) torch: Result<String, String>,
    pub(crate) gpu: Result<String, String>,
}

impl Env {
    pub(crate) fn bin(&self, name: &str) -> Result<PathBuf, String> {
        let p = self.bin_dir.join(name);
        if p.is_file() {
            Ok(p)
        } else {
            Err(format!(
                "{name} not found in {} (build it: `{BUILD_HINT}`)",
                self.bin_dir.display()
            ))
        }
    }

    pub(crate) fn script(&self, name: &str) -> PathBuf {
        self.compare_dir.join(name)
    }
}

pub(crate) fn detect_torch(no_torch: bool) -> Result<String, String> {
    if no_torch {
        return Err("--no-torch given".into());
    }
    let mut cmd = Command::new("python3");
    cmd.args([
        "-W",
        "ignore",
        "-c",
        "import torch; print(torch.__version__)",
    ]);
    match run(&mut cmd, Duration::from_secs(120)) {
        Ok(o) => Ok(o.stdout.trim().to_string()),
        Err(_) => Err("torch not installed (`pip install torch`)".into()),
    }
}

pub(crate) fn detect_gpu() -> Result<String, String> {
    let mut cmd = Command::new("nvidia-smi");
    cmd.args(["--query-gpu=name,driver_version", "--format=csv,noheader"]);
    match run(&mut cmd, Duration::from_secs(60)) {
        Ok(o) if !o.stdout.trim().is_empty() => {
            Ok(o.stdout.lines().next().unwrap_or("").trim().into())
        }
        _ if Path::new("/proc/driver/nvidia/version").exists() => {
            Err("an NVIDIA driver is loaded but `nvidia-smi` lists no GPU".into())
        }
        _ => Err("no NVIDIA GPU (`nvidia-smi` not found or failing)".into()),
    }
}
