//! A child process: its share of the simulated ranks, driven through the
//! phases by the parent's keys in the store (see `parent`).

use std::sync::Arc;
use std::time::Duration;

use chorus::rendezvous::{rendezvous, Rendezvous, RendezvousConfig};
use chorus::store::{ClientOptions, Store, StoreError, TcpStore, TorchStore, TorchStoreOptions};
use chorus::test_util::SimRank;
use chorus::WorkError;

use crate::{unix_ms, Args};

/// A control connection to the store at `addr`, PyTorch's or chorus's.
pub(crate) async fn control(addr: &str, torch: bool) -> Result<Arc<dyn Store>, StoreError> {
    Ok(if torch {
        Arc::new(TorchStore::connect(addr, TorchStoreOptions::default()).await?)
    } else {
        Arc::new(TcpStore::connect(addr, ClientOptions::default()).await?)
    })
}

/// Runs child `me`: form, stop (or watch), detect, re-form.
pub(crate) fn run(args: &Args, me: usize) -> Result<(), String> {
    let h = chorus_store::rt::handle()?;
    h.block_on(phases(args.clone(), me))
}

async fn phases(args: Args, me: usize) -> Result<(), String> {
    let addr = args.addr.clone().ok_or("a child needs --addr")?;
    let (host, port) = addr
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
        .ok_or_else(|| format!("bad store address {addr}"))?;
    let phase = Duration::from_secs(args.phase_timeout_s);
    let liveness = Duration::from_millis(args.liveness_ms);
    let n = args.ranks;
    let torch = args.torch.is_some();
    let ctl = control(&addr, torch)
        .await
        .map_err(|e| format!("child {me}: control connection: {e}"))?;
    let err =
        |what: &'static str| move |e: chorus::store::StoreError| format!("child {me}: {what}: {e}");
    if ctl.add("bench/ready", 1).await.map_err(err("ready"))? == args.procs as i64 {
        ctl.set("bench/ready_all", b"1")
            .await
            .map_err(err("ready"))?;
    }
    ctl.get("bench/go", phase).await.map_err(err("go"))?;

    // Form: rendezvous, then the group's control plane.
    let mine: Vec<usize> = (me..n).step_by(args.procs).collect();
    let mut joins = Vec::with_capacity(mine.len());
    for &r in &mine {
        let (host, port) = (host.clone(), port);
        joins.push(tokio::spawn(async move {
            let cfg = RendezvousConfig::builder()
                .rank(r)
                .world_size(n)
                .master_addr(host)
                .master_port(port)
                .timeout(phase);
            let cfg = if torch {
                cfg.torch_store("bench")
            } else {
                cfg.launcher_store()
            };
            let cfg = cfg.build().map_err(|e| format!("rank {r}: {e}"))?;
            let rv: Rendezvous = rendezvous(cfg)
                .await
                .map_err(|e| format!("rank {r}: {e}"))?;
            let sim = SimRank::join(rv.store(), "sim", 0, r, n, liveness)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>((sim, rv))
        }));
    }
    let mut ranks = Vec::with_capacity(mine.len());
    for j in joins {
        ranks.push(j.await.map_err(|e| format!("child {me}: {e}"))??);
    }
    let formed = ctl
        .add("bench/formed", mine.len() as i64)
        .await
        .map_err(err("formed"))?;
    if formed == n as i64 {
        ctl.set("bench/formed_all", b"1")
            .await
            .map_err(err("formed"))?;
    }

    // Stop one rank; every other one must find it silent.
    let stop = ctl
        .get("bench/stop", phase * 4)
        .await
        .map_err(err("stop"))?;
    let stop = String::from_utf8_lossy(&stop).into_owned();
    let (victim, t_stop) = stop
        .split_once(' ')
        .and_then(|(v, t)| Some((v.parse::<usize>().ok()?, t.parse::<u64>().ok()?)))
        .ok_or_else(|| format!("bad stop key {stop}"))?;
    let mut survivors = Vec::new();
    for (sim, rv) in ranks {
        if sim.rank() == victim {
            let mut sim = sim;
            sim.halt();
            // Keep its connection open, as a stopped process does.
            std::mem::forget((sim, rv));
        } else {
            survivors.push((sim, rv));
        }
    }
    let deadline = unix_ms() + phase.as_millis() as u64;
    let mut seen: Vec<Option<u64>> = vec![None; survivors.len()];
    let mut wrong = 0usize;
    while seen.iter().any(Option::is_none) && unix_ms() < deadline {
        for (i, (sim, _)) in survivors.iter().enumerate() {
            if seen[i].is_some() {
                continue;
            }
            if let Some(e) = sim.failure() {
                seen[i] = Some(unix_ms());
                if !matches!(e, WorkError::PeerSilent { peer, .. } if peer == victim) {
                    wrong += 1;
                    if wrong <= 3 {
                        eprintln!("child {me}: rank {} failed with {e}", sim.rank());
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let found = seen.iter().flatten().count();
    let last = seen
        .iter()
        .flatten()
        .max()
        .map_or(0, |t| t.saturating_sub(t_stop));
    let line = format!("{found} {wrong} {last}");
    ctl.set(&format!("bench/detected/{me}"), line.as_bytes())
        .await
        .map_err(err("detected"))?;
    if ctl
        .add("bench/detected", 1)
        .await
        .map_err(err("detected"))?
        == args.procs as i64
    {
        ctl.set("bench/detected_all", b"1")
            .await
            .map_err(err("detected"))?;
    }

    // Re-form without the stopped rank.
    let window = Duration::from_millis(args.window_ms);
    let mut reforms = Vec::with_capacity(survivors.len());
    let survivors: Vec<Arc<(SimRank, Rendezvous)>> = survivors.into_iter().map(Arc::new).collect();
    for s in &survivors {
        let s = s.clone();
        reforms.push(tokio::spawn(async move {
            let (next, members) = s.0.reform(window).await.map_err(|e| e.to_string())?;
            Ok::<_, String>((next, members.len(), unix_ms()))
        }));
    }
    let mut done = 0usize;
    let mut last = 0u64;
    let mut failed = 0usize;
    let mut next_groups = Vec::new();
    for j in reforms {
        match j.await.map_err(|e| format!("child {me}: {e}"))? {
            Ok((next, size, at)) if size == n - 1 => {
                done += 1;
                last = last.max(at);
                next_groups.push(next);
            }
            Ok((_, size, _)) => {
                failed += 1;
                eprintln!("child {me}: re-formed with {size} members, not {}", n - 1);
            }
            Err(e) => {
                failed += 1;
                if failed <= 3 {
                    eprintln!("child {me}: {e}");
                }
            }
        }
    }
    let line = format!("{done} {failed} {}", last.saturating_sub(t_stop));
    ctl.set(&format!("bench/reformed/{me}"), line.as_bytes())
        .await
        .map_err(err("reformed"))?;
    if ctl
        .add("bench/reformed", 1)
        .await
        .map_err(err("reformed"))?
        == args.procs as i64
    {
        ctl.set("bench/reformed_all", b"1")
            .await
            .map_err(err("reformed"))?;
    }
    ctl.get("bench/done", phase * 4)
        .await
        .map_err(err("done"))?;
    std::mem::forget((survivors, next_groups));
    Ok(())
}
