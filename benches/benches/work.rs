//! The host bookkeeping of one op, without a GPU: registering a work (its
//! registry entry and flight record, recorded as started), completing it
//! and dropping it, as the NCCL enqueue path does per op
//! ([`chorus_benches::work_bookkeeping_round`]).
//!
//! `cargo bench -p chorus-benches --bench work`.

use std::sync::Arc;
use std::time::Duration;

use chorus_runtime::flight_recorder::FlightRecorder;
use chorus_runtime::Registry;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn work(c: &mut Criterion) {
    let mut g = c.benchmark_group("work");
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    let reg = Arc::new(Registry::with_recorder(Arc::new(FlightRecorder::new(1024))));
    let group: Arc<str> = "bench".into();
    let mut seq = 0u64;
    g.bench_function("register-complete-drop", |b| {
        b.iter(|| {
            seq += 1;
            chorus_benches::work_bookkeeping_round(&reg, &group, seq).expect("work")
        })
    });
    g.finish();
}

criterion_group!(benches, work);
criterion_main!(benches);
