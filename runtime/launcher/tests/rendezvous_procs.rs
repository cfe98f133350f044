//! Rendezvous of ranks in separate processes, started by chorus-run.
//!
//! The rank program is this test executable itself: chorus-run runs it with
//! `--exact rank_process --nocapture` and `CHORUS_TEST_RANK_MODE` set, and
//! the `rank_process` test then plays one rank (it does nothing when the
//! variable is unset, i.e. in a normal test run).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use chorus_store::rendezvous::init_from_env;

const CHORUS_RUN: &str = env!("CARGO_BIN_EXE_chorus-run");
const MODE: &str = "CHORUS_TEST_RANK_MODE";
/// In mode `absent`: the rank that never joins.
const ABSENT: usize = 5;

/// The entry point of a rank process (see the module docs).
#[test]
fn rank_process() {
    let Ok(mode) = std::env::var(MODE) else {
        return;
    };
    // block_on: the rendezvous must not need the caller to run tokio.
    futures::executor::block_on(async {
        let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
        if mode == "absent" && rank == ABSENT {
            // Never joins; chorus-run stops it when the others fail.
            println!("absent");
            std::thread::sleep(Duration::from_secs(60));
            return;
        }
        let rdzv = match init_from_env().await {
            Ok(r) => r,
            Err(e) => {
                println!("init failed: {e}");
                std::process::exit(3);
            }
        };
        let store = rdzv.store();
        // A random contribution per rank; everyone reads everyone's.
        let mine: u32 = rand::random::<u32>() >> 1;
        store
            .set(&format!("val/{}", rdzv.rank()), mine.to_string().as_bytes())
            .await
            .unwrap();
        store.add("sum", i64::from(mine)).await.unwrap();
        let keys: Vec<String> = (0..rdzv.world_size()).map(|r| format!("val/{r}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let vals = store
            .multi_get(&keys, Duration::from_secs(20))
            .await
            .unwrap();
        let vals: Vec<String> = vals
            .into_iter()
            .map(|v| String::from_utf8(v).unwrap())
            .collect();
        println!(
            "joined rank={} world={} local={}/{} mine={} vals={}",
            rdzv.rank(),
            rdzv.world_size(),
            rdzv.local_rank(),
            rdzv.local_world_size(),
            mine,
            vals.join(",")
        );
        rdzv.shutdown().await.unwrap();
    });
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn chorus_run(mode: &str, nproc: usize, timeout_s: &str) -> Run {
    let out = rank_command(mode, timeout_s, &["--nproc-per-node", &nproc.to_string()])
        .output()
        .unwrap();
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// chorus-run with `launcher_args`, running this executable as the ranks.
fn rank_command(mode: &str, timeout_s: &str, launcher_args: &[&str]) -> Command {
    let exe = std::env::current_exe().unwrap();
    let mut c = Command::new(CHORUS_RUN);
    c.args(launcher_args)
        .args(["--kill-timeout", "1", "--"])
        .arg(exe)
        .args(["--exact", "rank_process", "--nocapture", "--test-threads=1"])
        .env(MODE, mode)
        .env("CHORUS_RENDEZVOUS_TIMEOUT", timeout_s)
        .stdin(Stdio::null());
    c
}

/// `rank -> text after "<tag>"` for the `[rank R] ...<tag>...` lines.
fn tagged<'a>(stdout: &'a str, tag: &str) -> BTreeMap<usize, &'a str> {
    stdout
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("[rank ")?;
            let (r, rest) = rest.split_once("] ")?;
            // libtest may have printed "test rank_process ... " first.
            Some((r.parse().ok()?, rest.split_once(tag)?.1))
        })
        .collect()
}

#[test]
fn eight_processes_join_under_chorus_run() {
    let run = chorus_run("join", 8, "30");
    assert_eq!(
        run.code,
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    let joined = tagged(&run.stdout, "joined ");
    assert_eq!(joined.len(), 8, "{}", run.stdout);
    let mut mine = BTreeMap::new();
    let mut all_vals = Vec::new();
    for (&rank, line) in &joined {
        let f: BTreeMap<&str, &str> = line
            .split(' ')
            .map(|kv| kv.split_once('=').unwrap())
            .collect();
        // The rank the process joined as is the one chorus-run gave it.
        assert_eq!(f["rank"], rank.to_string());
        assert_eq!(f["world"], "8");
        assert_eq!(f["local"], format!("{rank}/8"));
        mine.insert(rank, f["mine"].to_string());
        all_vals.push(f["vals"].to_string());
    }
    // Every rank read every rank's random value, in rank order.
    let expected = mine.values().cloned().collect::<Vec<_>>().join(",");
    for v in all_vals {
        assert_eq!(v, expected);
    }
}

#[test]
fn two_launchers_as_two_nodes() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let node = |i: &str| {
        rank_command(
            "join",
            "30",
            &[
                "--nproc-per-node",
                "2",
                "--nnodes",
                "2",
                "--node-rank",
                i,
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                &port,
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    };
    // Node 1 first: its ranks wait for rank 0's store to come up.
    let n1 = node("1");
    let n0 = node("0");
    for (n, child) in [(0, n0), (1, n1)] {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "node {n}:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let joined = tagged(&stdout, "joined ");
        let ranks: Vec<usize> = joined.keys().copied().collect();
        assert_eq!(ranks, [2 * n, 2 * n + 1]);
        for (rank, line) in joined {
            assert!(
                line.starts_with(&format!("rank={rank} world=4 local={}/2 ", rank % 2)),
                "{line}"
            );
        }
    }
}

#[test]
fn a_process_that_never_joins_is_named_within_the_timeout() {
    let run = chorus_run("absent", 8, "1.5");
    // The other ranks fail (exit 3); chorus-run stops rank 5 and reports.
    assert_eq!(
        run.code,
        Some(3),
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    let failed = tagged(&run.stdout, "init failed: ");
    assert!(!failed.is_empty(), "{}", run.stdout);
    for (rank, msg) in &failed {
        assert_ne!(*rank, ABSENT);
        assert!(
            msg.starts_with("ranks [5] of 8 never joined within 1.5s"),
            "rank {rank}: {msg}"
        );
    }
    assert!(tagged(&run.stdout, "absent").contains_key(&ABSENT));
    assert!(
        run.stderr
            .contains("exited with code 3; stopping the other ranks"),
        "{}",
        run.stderr
    );
}
