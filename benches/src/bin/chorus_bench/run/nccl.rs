//! Running the NCCL comparisons: `nccl_bench` beside ProcessGroupNCCL,
//! `group_bench` beside raw NCCL and PyTorch's coalescing manager.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::child::run;
use crate::cli::Plan;
use crate::env::Env;
use crate::parse::read_json;

#[derive(Debug, Default)]
pub(crate) struct NcclResult {
    pub(crate) skipped: Option<String>,
    pub(crate) ours: Vec<Value>,
    pub(crate) anchor: Vec<Value>,
    pub(crate) anchor_skipped: Option<String>,
    /// `group_bench --json` runs (chorus and raw NCCL) and their PyTorch
    /// anchor (`torch_coalesce.py --json`).
    pub(crate) groups: Vec<Value>,
    pub(crate) groups_anchor: Vec<Value>,
    pub(crate) groups_skipped: Option<String>,
}

pub(crate) fn bench_nccl(env: &Env, plan: &Plan, tmp: &Path) -> NcclResult {
    let mut r = NcclResult::default();
    if let Err(e) = &env.gpu {
        r.skipped = Some(e.clone());
        return r;
    }
    let bench = match env.bin("nccl_bench") {
        Ok(b) => b,
        Err(e) => {
            r.skipped = Some(e);
            return r;
        }
    };
    r.anchor_skipped = match &env.torch {
        Err(e) => Some(e.clone()),
        Ok(_) => {
            let mut cmd = Command::new("python3");
            cmd.args([
                "-W",
                "ignore",
                "-c",
                "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)",
            ]);
            run(&mut cmd, Duration::from_secs(120)).err().map(|_| {
                "torch has no CUDA here (`torch.cuda.is_available()` is false)".to_string()
            })
        }
    };
    let quick_args: &[&str] = if plan.quick {
        &["--iters", "2000", "--wake-iters", "50", "--seconds", "0.3"]
    } else {
        &[]
    };
    for rep in 0..plan.reps {
        eprintln!("nccl: run {}/{}", rep + 1, plan.reps);
        let json = tmp.join(format!("nccl_bench_{rep}.json"));
        let mut cmd = Command::new(&bench);
        cmd.args(quick_args).arg("--json").arg(&json);
        match run(&mut cmd, plan.timeout).and_then(|_| read_json(&json)) {
            Ok(v) => r.ours.push(v),
            Err(e) => {
                r.skipped = Some(format!("nccl_bench failed: {e}"));
                return r;
            }
        }
        bench_groups(env, plan, tmp, rep, &mut r);
        if r.anchor_skipped.is_none() {
            let json = tmp.join(format!("torch_nccl_{rep}.json"));
            let mut cmd = Command::new("python3");
            cmd.args(["-W", "ignore"]).arg(env.script("torch_nccl.py"));
            if plan.quick {
                cmd.args(["--iters", "2000", "--seconds", "0.3"]);
            }
            cmd.arg("--json").arg(&json);
            match run(&mut cmd, plan.timeout).and_then(|_| read_json(&json)) {
                Ok(v) => r.anchor.push(v),
                Err(e) => r.anchor_skipped = Some(format!("ProcessGroupNCCL side failed: {e}")),
            }
        }
    }
    r
}

/// One run of `group_bench` and, when PyTorch runs here, `torch_coalesce.py`.
pub(crate) fn bench_groups(env: &Env, plan: &Plan, tmp: &Path, rep: usize, r: &mut NcclResult) {
    if r.groups_skipped.is_some() {
        return;
    }
    let bench = match env.bin("group_bench") {
        Ok(b) => b,
        Err(e) => {
            r.groups_skipped = Some(e);
            return;
        }
    };
    let iters: &[&str] = if plan.quick { &["--iters", "50"] } else { &[] };
    let json = tmp.join(format!("group_bench_{rep}.json"));
    let mut cmd = Command::new(&bench);
    cmd.args(iters).arg("--json").arg(&json);
    match run(&mut cmd, plan.timeout).and_then(|_| read_json(&json)) {
        Ok(v) => r.groups.push(v),
        Err(e) => {
            r.groups_skipped = Some(format!("group_bench failed: {e}"));
            return;
        }
    }
    if r.anchor_skipped.is_none() {
        let json = tmp.join(format!("torch_coalesce_{rep}.json"));
        let mut cmd = Command::new("python3");
        cmd.args(["-W", "ignore"])
            .arg(env.script("torch_coalesce.py"))
            .args(iters)
            .arg("--json")
            .arg(&json);
        if let Ok(v) = run(&mut cmd, plan.timeout).and_then(|_| read_json(&json)) {
            r.groups_anchor.push(v);
        }
    }
}
