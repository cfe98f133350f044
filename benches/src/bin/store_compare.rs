//! Prints chorus's store ops/s in the format of
//! `benches/compare/torch_store.py`, for `chorus-bench`'s store suite.
//!
//! `store_compare [SECONDS]` (default 2): 1 and 16 clients with one op in
//! flight each (like PyTorch's synchronous calls), and 1 client with 32
//! and 128 ops in flight (pipelined on one connection). Lines read
//! `chorus <op> <clients>[x<in flight>] <ops/s>`.
#![forbid(unsafe_code)]

use chorus_benches::store::{ops_per_sec, Op, Setup};

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    futures::executor::block_on(async {
        println!(
            "# chorus TcpStore, loopback, 64-byte values, {} cores, awaited from futures::executor::block_on",
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        for (clients, inflight) in [(1, 1), (16, 1), (1, 32), (1, 128)] {
            let setup = Setup::new(clients).await;
            for op in Op::ALL {
                let rate = ops_per_sec(&setup, op, inflight, secs).await;
                let label = if inflight == 1 {
                    format!("{clients:>3}")
                } else {
                    format!("{clients}x{inflight}")
                };
                println!("chorus {:<4} {label:>5}  {rate:>12.0}", op.name());
            }
            setup.server.shutdown().await;
        }
    });
}
