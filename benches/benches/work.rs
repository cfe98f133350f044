//! The host bookkeeping of one op, without a GPU: registering a work (its
//! registry entry and flight record, recorded as started), completing it
//! and dropping it, as the NCCL enqueue path does per op
//! ([`chorus_benches::work_bookkeeping_round`]).
//!
//! `register-complete-drop` does it all on one thread (an awaited op's
//! first poll completes it there); `register-completed-elsewhere` times the
//! registering thread (and its hand-off of a batch) while another thread completes and drops the
//! works in batches of 16, as the completion reactor does for ops taken
//! back stream-ordered; `batch16-register-complete-drop` registers 16 ops
//! as one batch (a group's launch, `chorus_core::WorkBatch`), per op (what the enqueuing thread pays then includes the
//! cache lines and memory the other thread hands back).
//!
//! `cargo bench -p chorus-benches --bench work`.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use chorus_core::flight_recorder::FlightRecorder;
use chorus_core::Registry;
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
    // Per op, as `register-complete-drop`: 16 ops registered as one batch
    // (a group's launch), completed and dropped.
    g.bench_function("batch16-register-complete-drop", |b| {
        b.iter_custom(|iters| {
            let t0 = std::time::Instant::now();
            for _ in 0..iters.div_ceil(16) {
                let works =
                    chorus_benches::started_batch(&reg, &group, seq + 1, 16, t0).expect("works");
                seq += 16;
                for (w, c) in works {
                    c.complete(Ok(1));
                    drop(w);
                }
            }
            t0.elapsed()
        })
    });
    g.bench_function("register-completed-elsewhere", |b| {
        type Batch = Vec<(chorus_core::OpFuture<u32>, chorus_core::Completer<u32>)>;
        let (tx, rx) = std::sync::mpsc::sync_channel::<Batch>(64);
        let worker = std::thread::spawn(move || {
            for batch in rx {
                for (w, c) in batch {
                    c.complete(Ok(1));
                    drop(w);
                }
            }
        });
        b.iter_custom(|iters| {
            let mut batch = Vec::with_capacity(16);
            let t0 = std::time::Instant::now();
            for _ in 0..iters {
                seq += 1;
                let pair = chorus_benches::started_work(&reg, &group, seq, t0).expect("work");
                batch.push(pair);
                if batch.len() == 16 {
                    tx.send(std::mem::replace(&mut batch, Vec::with_capacity(16)))
                        .expect("worker");
                }
            }
            let spent = t0.elapsed();
            tx.send(batch).expect("worker");
            spent
        });
        drop(tx);
        worker.join().expect("worker");
    });
    g.finish();
}

criterion_group!(benches, work);
criterion_main!(benches);
