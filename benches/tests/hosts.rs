//! all_reduce f32 between test hosts, chorus beside PyTorch's Gloo: a
//! benchmark, not a check, kept as an ignored test because it needs the
//! test hosts of `tests_integration::netns` (network namespaces joined by a
//! switch, real TCP over veth between them; root).
//!
//! 2 hosts × 1 and × 2 ranks: chorus (`tcp_allreduce` under one
//! `chorus-run` per host) and Gloo (`gloo_allreduce.py`, one call per
//! host, `GLOO_SOCKET_IFNAME=eth0`) in the same hosts, and the link's own
//! floor (`pingpong` between the hosts: a blocking ping-pong of the small
//! sizes, exchanges of 16 and 24 MiB both ways at once). Prints Markdown
//! tables. Run it in release with a Python that has PyTorch:
//!
//! ```text
//! CHORUS_TORCH_PYTHON=python3 cargo nextest run --release -p chorus-benches \
//!   --test hosts --run-ignored only --no-capture
//! ```
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use tests_integration::netns::{outputs, Hosts, Output};
use tests_integration::testkit::workspace_bin;

const SIZES: &str = "4,65536,16777216";

/// Waits (at most 300 s each) for every node's program of `what` to exit 0.
fn all_succeed(h: &mut Hosts, nodes: &[(usize, Output)], what: &str) {
    for (id, _) in nodes {
        let st = h.wait(*id, Duration::from_secs(300));
        assert!(
            st.is_some_and(|s| s.success()),
            "{what}: {st:?}\n{}",
            outputs(nodes)
        );
    }
}

/// The JSON lines a program printed (launcher prefixes stripped).
fn json_rows(out: &Output) -> Vec<serde_json::Value> {
    out.lines()
        .iter()
        .filter_map(|l| {
            let l = l.split("] ").last().unwrap_or(l).trim();
            if l.starts_with('{') {
                serde_json::from_str(l).ok()
            } else {
                None
            }
        })
        .collect()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// `chorus-run --nnodes 2 --node-rank I ... -- tcp_allreduce` in each host.
fn chorus(h: &mut Hosts, nproc: usize) -> Vec<serde_json::Value> {
    let run = workspace_bin("chorus-launcher", "chorus-run");
    let bench = env!("CARGO_BIN_EXE_tcp_allreduce");
    let nodes: Vec<_> = (0..h.len())
        .map(|i| {
            let args = strings(&[
                "--nnodes",
                &h.len().to_string(),
                "--node-rank",
                &i.to_string(),
                "--nproc-per-node",
                &nproc.to_string(),
                "--master-addr",
                "node0",
                "--master-port",
                "29611",
                "--",
                bench,
                "--sizes",
                SIZES,
                "--budget-s",
                "2",
            ]);
            h.spawn(i, &run, &args, &[])
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    all_succeed(h, &nodes, "chorus");
    json_rows(&nodes[0].1)
}

/// `gloo_allreduce.py --nnodes 2 --node-rank I` in each host.
fn gloo(h: &mut Hosts, nproc: usize) -> Vec<serde_json::Value> {
    let python = std::env::var("CHORUS_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("compare/gloo_allreduce.py");
    let env = [
        ("GLOO_SOCKET_IFNAME".to_string(), "eth0".to_string()),
        ("OMP_NUM_THREADS".to_string(), "1".to_string()),
    ];
    let nodes: Vec<_> = (0..h.len())
        .map(|i| {
            let args = strings(&[
                script.to_string_lossy().as_ref(),
                "--ranks",
                &nproc.to_string(),
                "--nnodes",
                &h.len().to_string(),
                "--node-rank",
                &i.to_string(),
                "--master-addr",
                "10.77.0.1",
                "--master-port",
                "29612",
                "--sizes",
                SIZES,
                "--budget-s",
                "2",
            ]);
            h.spawn(i, &PathBuf::from(&python), &args, &env)
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect();
    all_succeed(h, &nodes, "gloo");
    json_rows(&nodes[0].1)
}

/// The link between host 0 and host 1 as a blocking program sees it: a
/// ping-pong of the small sizes and exchanges of 16 and 24 MiB both ways
/// at once (`pingpong --listen` / `--connect`); its JSON rows.
fn link_floor(h: &mut Hosts) -> Vec<serde_json::Value> {
    let pp = PathBuf::from(env!("CARGO_BIN_EXE_pingpong"));
    let server = h
        .spawn(0, &pp, &strings(&["--listen", "10.77.0.1:29614"]), &[])
        .unwrap_or_else(|e| panic!("{e}"));
    let client = h
        .spawn(
            1,
            &pp,
            &strings(&[
                "--connect",
                "10.77.0.1:29614",
                "--sizes",
                "4,65536",
                "--exchange-bytes",
                "16777216,25165824",
            ]),
            &[],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let both = [server, client];
    all_succeed(h, &both, "pingpong");
    json_rows(&both[1].1)
}

#[test]
#[ignore = "a benchmark: needs root (network namespaces), release executables and PyTorch"]
fn all_reduce_across_hosts_beside_gloo() {
    println!(
        "| hosts × ranks | bytes | chorus median µs | Gloo median µs | latency ratio | chorus busbw GB/s | Gloo busbw GB/s | busbw ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut floors = Vec::new();
    for nproc in [1usize, 2] {
        let mut h = Hosts::new(2).unwrap_or_else(|e| panic!("{e}"));
        floors.extend(link_floor(&mut h));
        let ours = chorus(&mut h, nproc);
        let theirs = gloo(&mut h, nproc);
        for o in &ours {
            let b = o["bytes"].as_u64().unwrap_or(0);
            let Some(g) = theirs.iter().find(|g| g["bytes"].as_u64() == Some(b)) else {
                continue;
            };
            let num = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
            let (om, gm) = (num(o, "median_us"), num(g, "median_us"));
            let (ob, gb) = (num(o, "busbw_gbps"), num(g, "busbw_gbps"));
            // Tiny messages round their bus bandwidth to 0: no ratio.
            let bw_ratio = if gb > 0.0 {
                format!("{:.2}×", ob / gb)
            } else {
                "–".into()
            };
            println!(
                "| 2 × {nproc} | {b} | {om:.1} | {gm:.1} | {:.2}× | {ob:.3} | {gb:.3} | {bw_ratio} |",
                gm / om
            );
        }
    }
    // A 2-rank all_reduce of S bytes moves S each way over the link (half
    // in its reduce-scatter, half in its all-gather); on 2 × 2 the ring
    // crosses the link once each way with 1.5 S.
    println!("\nThe link's floor in the same hosts (`pingpong`, one thread per direction):\n");
    println!("| what | bytes | median µs | p99 µs | GB/s each way |");
    println!("|---|---|---|---|---|");
    for f in &floors {
        let num = |k: &str| f[k].as_f64().unwrap_or(f64::NAN);
        let gbps = f["gbps_each_way"]
            .as_f64()
            .map_or_else(String::new, |g| format!("{g:.3}"));
        println!(
            "| {} | {} | {:.1} | {:.1} | {gbps} |",
            f["mode"].as_str().unwrap_or("?"),
            num("bytes"),
            num("median_us"),
            num("p99_us"),
        );
    }
}
