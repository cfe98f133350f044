//! `--init-only`: how long a group of this many ranks takes to form
//! (`ProcessGroup::builder().init_from_env()`, the TCP backend's setup
//! included) and to run its first 4-byte all_reduce (connections made on
//! the way included). Rank 0 prints one JSON line:
//!
//! ```text
//! {"impl":"chorus","mode":"init","ranks":N,"init_ms":..,"init_span_ms":..,"first_op_ms":..}
//! ```
//!
//! `init_ms` is the slowest rank's own init call, `init_span_ms` the time
//! from the first rank's call to the last rank's return (epoch clock),
//! `first_op_ms` the slowest rank's first all_reduce, started by every rank
//! after a barrier through the job's store (which makes no connection
//! between ranks), so that it does not count the wait for the last rank's
//! init; `unsynced_first_op_ms` the same without that barrier (another
//! run: the first op of ranks that come out of init at different times).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chorus::{ProcessGroup, ReduceOp, TcpOptions};
use chorus_store::{ClientOptions, Store, TcpStore};

fn epoch_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// Every rank of `n` reaches this point before any goes on: a counter and
/// a key in the job's store (`MASTER_ADDR:MASTER_PORT`, with
/// `CHORUS_STORE_TOKEN` if set).
async fn store_barrier(n: usize) -> Result<(), Box<dyn std::error::Error>> {
    let addr = format!(
        "{}:{}",
        std::env::var("MASTER_ADDR")?,
        std::env::var("MASTER_PORT")?
    );
    let opts = ClientOptions {
        token: std::env::var("CHORUS_STORE_TOKEN").ok(),
        ..ClientOptions::default()
    };
    let store = TcpStore::connect(&addr, opts).await?;
    if store.add("tcp_allreduce/init/in", 1).await? == n as i64 {
        store.set("tcp_allreduce/init/go", b"1").await?;
    }
    store
        .wait(&["tcp_allreduce/init/go"], Duration::from_secs(300))
        .await?;
    Ok(())
}

/// Forms the group, runs one 4-byte all_reduce (after a store barrier
/// with `sync`), reports.
pub(crate) async fn run(opts: TcpOptions, sync: bool) -> Result<(), Box<dyn std::error::Error>> {
    let start_epoch = epoch_ms();
    let t0 = Instant::now();
    let pg = ProcessGroup::builder()
        .tcp_options(opts)
        .init_from_env()
        .await?;
    let init = t0.elapsed().as_secs_f64() * 1e3;
    let end_epoch = epoch_ms();
    if sync {
        store_barrier(pg.size()).await?;
    }
    let t1 = Instant::now();
    let v = pg.all_reduce(vec![1.0f32], ReduceOp::Sum)?.await?;
    let first = t1.elapsed().as_secs_f64() * 1e3;
    let n = pg.size();
    if v[0] as usize != n {
        return Err(format!("the first all_reduce gave {} instead of {n}", v[0]).into());
    }
    // The slowest rank's figures, and the span from the earliest start.
    let m = pg
        .all_reduce(vec![init, first, -start_epoch, end_epoch], ReduceOp::Max)?
        .await?;
    if pg.rank() == 0 {
        println!(
            "{}",
            serde_json::json!({
                "impl": "chorus", "mode": "init", "ranks": n,
                "init_ms": m[0], "init_span_ms": m[3] + m[2],
                if sync { "first_op_ms" } else { "unsynced_first_op_ms" }: m[1],
            })
        );
    }
    pg.shutdown().await?;
    Ok(())
}
