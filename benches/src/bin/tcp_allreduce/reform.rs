//! `tcp_allreduce --reform`: the time from detecting a lost rank to the
//! first op on the re-formed group (TCP backend, ranks as tasks of one
//! process over loopback, one in-memory store).
//!
//! Each trial builds a group of `--ranks`, starts an all_reduce on every
//! rank, aborts and drops the last rank's group mid-op (its connections
//! close, as when the process dies), and on each survivor measures from
//! the moment its work failed to the end of its first all_reduce on the
//! group `reform(--window-ms)` returned. With a rank missing, the quorum
//! closes when the first announcer's window passes, so the figure is the
//! window plus the overhead printed separately; `--all-alive` re-forms
//! with nobody lost (the quorum closes as soon as everyone announced).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus::store::{InMemoryStore, Store};
use chorus::{ProcessGroup, ReduceOp};

use crate::Args;

async fn groups(size: usize, name: &str) -> Result<Vec<ProcessGroup>, chorus::Error> {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let handles: Vec<_> = (0..size)
        .map(|rank| {
            let store = store.clone();
            let name = name.to_string();
            tokio::spawn(async move {
                ProcessGroup::builder()
                    .rank(rank)
                    .world_size(size)
                    .store(store)
                    .name(name)
                    .timeout(Duration::from_secs(30))
                    .build()
                    .await
            })
        })
        .collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(
            h.await
                .map_err(|e| chorus::Error::InvalidArgument(e.to_string()))??,
        );
    }
    Ok(out)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the trials and prints the median and the maximum.
pub(crate) async fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let window = Duration::from_millis(args.window_ms);
    let all_alive = args.all_alive;
    let mut totals = Vec::new();
    for t in 0..args.trials {
        let gs = groups(args.ranks, &format!("reform{t}")).await?;
        let lost = if all_alive {
            None
        } else {
            Some(args.ranks - 1)
        };
        let mut tasks = Vec::new();
        for (r, g) in gs.into_iter().enumerate() {
            if Some(r) == lost {
                // It dies before its all_reduce: the others' fails.
                g.abort("lost");
                drop(g);
                continue;
            }
            let w = g.all_reduce(vec![1.0f32; 1 << 16], ReduceOp::Sum)?;
            tasks.push(tokio::spawn(async move {
                if all_alive {
                    // A drill: the op may finish first; the re-form
                    // starts from here either way.
                    g.abort("re-form drill");
                }
                let r = w.await.map(|_| ());
                let detected = Instant::now();
                if r.is_ok() && !all_alive {
                    return Err("the op did not fail".to_string());
                }
                let new = g.reform(window).await.map_err(|e| e.to_string())?;
                new.all_reduce(vec![1.0f32; 1024], ReduceOp::Sum)
                    .map_err(|e| e.to_string())?
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<f64, String>(detected.elapsed().as_secs_f64() * 1e3)
            }));
        }
        for task in tasks {
            totals.push(task.await??);
        }
    }
    let m = median(&mut totals);
    let over = if all_alive {
        0.0
    } else {
        m - window.as_secs_f64() * 1e3
    };
    println!(
        "tcp_allreduce --reform ranks={} lost={} window_ms={} trials={}: detection to first op on the new group median {:.1} ms (beyond the window: {:.1} ms), max {:.1} ms",
        args.ranks,
        usize::from(!all_alive),
        args.window_ms,
        args.trials,
        m,
        over,
        totals.iter().copied().fold(0.0, f64::max)
    );
    Ok(())
}
