//! Store round trips over loopback: set, get and add of 64-byte values,
//! with 1 and 16 clients (one op in flight per client), and 1 client with
//! 32 ops in flight. Awaited from `futures::executor::block_on`: the
//! client's I/O runs on chorus's own runtime.
//!
//! `cargo bench -p chorus-benches --bench store`; throughput is reported
//! in ops/s ("elem/s").
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use chorus_benches::store::{run_ops, Op, Setup};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use futures::executor::block_on;
use futures::future::join_all;

fn store(c: &mut Criterion) {
    let mut g = c.benchmark_group("store");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    for (clients, inflight) in [(1usize, 1usize), (16, 1), (1, 32)] {
        let setup = block_on(Setup::new(clients));
        let per_iter = (clients * inflight) as u64;
        g.throughput(Throughput::Elements(per_iter));
        for op in Op::ALL {
            let name = if inflight == 1 {
                format!("{}/{clients}-clients", op.name())
            } else {
                format!("{}/{clients}-client-{inflight}-in-flight", op.name())
            };
            g.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    block_on(join_all(setup.clients.iter().enumerate().flat_map(
                        |(i, c)| (0..inflight).map(move |_| run_ops(c, i, op, iters)),
                    )));
                    start.elapsed()
                })
            });
        }
        block_on(setup.server.shutdown());
    }
    g.finish();
}

criterion_group!(benches, store);
criterion_main!(benches);
