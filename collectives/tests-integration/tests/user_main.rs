//! A rank whose `main` returns `chorus::Error` with `?` (as programs
//! written from the docs do), run as separate processes: what it prints
//! while it waits for ranks that never come, and when it gives up.
#![forbid(unsafe_code)]

use std::net::TcpListener;
use std::process::{Command, Output};

use tests_integration::testkit::workspace_bin;

/// A port free on 127.0.0.1 a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs the rank program as rank `rank` of `world` ranks on this host,
/// with `extra` variables, and no other launcher's variables.
fn rank(rank: usize, world: usize, port: u16, extra: &[(&str, &str)]) -> (Output, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_chorus-main-rank"));
    cmd.env_remove("SLURM_PROCID")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("CHORUS_STORE_HOST")
        .env_remove("CHORUS_RUN_PID")
        .env_remove("CHORUS_RANK_RESTARTS")
        .env_remove("RUST_LOG")
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("LOCAL_WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("start chorus-main-rank");
    let text = text(&out);
    (out, text)
}

fn text(out: &Output) -> String {
    format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `?` in main prints the error's message, not its structure.
#[test]
fn an_error_returned_from_main_prints_its_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_chorus-main-rank"))
        .env_remove("RANK")
        .env_remove("SLURM_PROCID")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .output()
        .expect("start chorus-main-rank");
    let text = text(&out);
    assert!(!out.status.success(), "{text}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "Error: rendezvous: no rank in the environment: none of RANK (torchrun, chorus-run), \
             SLURM_PROCID (srun) or OMPI_COMM_WORLD_RANK (mpirun) is set"
        ),
        "{text}"
    );
    assert!(!stderr.contains("NoLauncher"), "{text}");
}

/// Rank 1 started without rank 0 says, while it waits, that it waits to
/// connect to rank 0's store and where; then it fails naming the address.
#[test]
fn a_rank_started_without_rank_0_reports_its_wait_then_names_the_store() {
    let port = free_port();
    let (out, text) = rank(
        1,
        2,
        port,
        &[
            ("CHORUS_RENDEZVOUS_TIMEOUT", "3"),
            ("CHORUS_WAIT_REPORT_S", "0.5"),
        ],
    );
    assert!(!out.status.success(), "{text}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let reports: Vec<&str> = stderr
        .lines()
        .filter(|l| {
            l.starts_with(&format!(
                "chorus: rank 1 waits to connect to the job's store, served by rank 0, at \
                 127.0.0.1:{port}; waited "
            ))
        })
        .collect();
    assert!(!reports.is_empty(), "{text}");
    for r in &reports {
        assert!(
            r.contains(" of at most 3s; is rank 0 running, and MASTER_ADDR/MASTER_PORT the same on every rank?"),
            "{text}"
        );
    }
    // The first report says how to turn them off.
    assert!(
        reports[0].ends_with("(CHORUS_WAIT_REPORT_S=0 turns these reports off)"),
        "{text}"
    );
    assert!(
        stderr.contains(&format!(
            "Error: rank 1 could not connect to the store of rank 0 at 127.0.0.1:{port} within 3s"
        )),
        "{text}"
    );
}

/// Rank 0 alone hosts the store and waits for the others to join: it
/// says how many joined of how many, then names the ranks that never did.
#[test]
fn a_rank_waiting_for_the_others_to_join_counts_them_then_names_the_missing() {
    let port = free_port();
    let (out, text) = rank(
        0,
        3,
        port,
        &[
            ("CHORUS_RENDEZVOUS_TIMEOUT", "3"),
            ("CHORUS_WAIT_REPORT_S", "0.5"),
        ],
    );
    assert!(!out.status.success(), "{text}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let prefix = format!(
        "chorus: rank 0 waits for the job's 3 ranks to join, through the store at \
         127.0.0.1:{port} (key chorus/rdzv/all_joined): 1 of 3 ranks joined; waited "
    );
    assert!(stderr.lines().any(|l| l.starts_with(&prefix)), "{text}");
    assert!(
        stderr.contains("Error: ranks [1, 2] of 3 never joined within 3s"),
        "{text}"
    );
}

/// `CHORUS_WAIT_REPORT_S=0` silences the reports; the wait and its error
/// are the same.
#[test]
fn reports_can_be_turned_off() {
    let port = free_port();
    let (out, text) = rank(
        1,
        2,
        port,
        &[
            ("CHORUS_RENDEZVOUS_TIMEOUT", "1.5"),
            ("CHORUS_WAIT_REPORT_S", "0"),
        ],
    );
    assert!(!out.status.success(), "{text}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("chorus: rank 1 waits"), "{text}");
    assert!(
        stderr.contains("Error: rank 1 could not connect to the store of rank 0"),
        "{text}"
    );
}

/// Under chorus-run the program runs to its end: a world rank, no
/// restart, not a replacement.
#[test]
fn under_chorus_run_every_rank_knows_its_world_rank_and_that_it_is_no_replacement() {
    let out = Command::new(workspace_bin("chorus-launcher", "chorus-run"))
        .args(["--nproc-per-node", "3", "--"])
        .arg(env!("CARGO_BIN_EXE_chorus-main-rank"))
        .output()
        .expect("start chorus-run");
    let text = text(&out);
    assert!(out.status.success(), "{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for r in 0..3 {
        assert!(
            stdout.lines().any(|l| l
                == format!("[rank {r}] OK rank={r} world_rank={r} restarts=0 replacement=false")),
            "{text}"
        );
    }
}
