//! chorus under SLURM: a batch script of the form docs/LAUNCHING.md gives
//! (MASTER_ADDR from the job's node list, then srun), through sbatch.
//!
//! Needs a SLURM cluster where `sbatch` runs (CI starts a one-node cluster
//! with .ci/slurm.sh); ignored by default, run with `--run-ignored only`.
#![forbid(unsafe_code)]

use std::process::Command;

#[test]
#[ignore = "needs a SLURM cluster (.ci/slurm.sh)"]
fn every_op_under_sbatch_and_srun() {
    let dir = std::env::temp_dir().join(format!("chorus-srun-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (script, out) = (dir.join("job.sh"), dir.join("job.out"));
    let port = {
        let l = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        l.local_addr().unwrap().port()
    };
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\n\
             #SBATCH --ntasks=3 --ntasks-per-node=3 --time=5\n\
             export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n1)\n\
             export MASTER_PORT={port}\n\
             srun {} matrix\n",
            env!("CARGO_BIN_EXE_chorus-test-rank")
        ),
    )
    .unwrap();
    let status = Command::new("sbatch")
        .arg("--wait")
        .arg(format!("--output={}", out.display()))
        .arg(&script)
        .status()
        .expect("run sbatch (is SLURM installed and its cluster up?)");
    let log = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(status.success(), "{status:?}\n{log}");
    for r in 0..3 {
        assert!(
            log.lines()
                .any(|l| l.starts_with(&format!("OK rank={r} checks="))),
            "rank {r} did not report OK:\n{log}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
