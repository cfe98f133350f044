//! The NCCL backend on a GPU: 1-rank communicators exercise the whole path
//! (cache, non-blocking init, streams, events, reactor, futures, abort).
//!
//! The `gpu_` tests are ignored by default and run on the GPU machine with
//! `--include-ignored`; they FAIL when no GPU is found. Run them with
//! `--test-threads=1` (they share device 0 and the process-wide reactor).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus::store::{InMemoryStore, Store};
use chorus::test_util::Kernels;
use chorus::test_util::{one_rank_group, reference_reduce, Reducible};
use chorus::{DType, DeviceElement, DeviceMem};
use chorus::{Device, Stream, StreamPriority};
use chorus::{DeviceBuffer, ProcessGroup, RawDeviceBuffer, ReduceOp, WorkError, WorkStatus};
use futures::executor::block_on;
use half::{bf16, f16};
use rand::{Rng, SeedableRng};

fn device0() -> Device {
    Device::get(0).unwrap_or_else(|e| panic!("this GPU test needs a CUDA GPU: {e}"))
}

/// A one-rank group on device 0, its communicator created at once.
fn group(name: &str) -> ProcessGroup {
    one_rank_group(name, 0).unwrap_or_else(|e| panic!("group {name}: {e}"))
}

/// A one-rank group that creates its communicator at its first device op.
fn lazy_group(store: &Arc<dyn Store>, name: &str) -> ProcessGroup {
    let b = ProcessGroup::builder()
        .rank(0)
        .world_size(1)
        .store(store.clone())
        .name(name)
        .timeout(Duration::from_secs(60));
    block_on(b.build()).unwrap_or_else(|e| panic!("group {name}: {e}"))
}

fn store() -> Arc<dyn Store> {
    Arc::new(InMemoryStore::new())
}

fn upload<T: DeviceElement + Copy>(s: &Stream, v: &[T]) -> DeviceBuffer<T> {
    DeviceBuffer::new(s.clone_htod(v).unwrap()).unwrap()
}

fn download<T: DeviceElement + Copy + Default>(b: &DeviceBuffer<T>) -> Vec<T> {
    b.producer().clone_dtoh(b.slice()).unwrap()
}

/// Every op on random data against the serial reference (1 rank: the
/// reduction of one input), outputs poisoned first.
fn every_op<T>(
    pg: &ProcessGroup,
    s: &Stream,
    gen: &mut dyn FnMut() -> T,
    n: usize,
    fails: &mut Vec<String>,
) where
    T: DeviceElement + Reducible + Copy + Default + PartialEq + std::fmt::Debug,
{
    let name = format!("{} n={n}", std::any::type_name::<T>());
    let data: Vec<T> = (0..n).map(|_| gen()).collect();
    let poison: Vec<T> = (0..n).map(|_| gen()).collect();
    assert_ne!(data, poison, "{name}: poison must differ from data");
    for op in [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ] {
        let want = reference_reduce(op, std::slice::from_ref(&data));
        let b = block_on(pg.all_reduce(upload(s, &data), op).unwrap()).unwrap();
        check(
            fails,
            &download(&b),
            &want,
            format!("{name} all_reduce {op}"),
        );
        let b = block_on(pg.reduce(upload(s, &data), 0, op).unwrap()).unwrap();
        check(fails, &download(&b), &want, format!("{name} reduce {op}"));
        let (_, o) = block_on(
            pg.reduce_scatter(upload(s, &data), upload(s, &poison), op)
                .unwrap(),
        )
        .unwrap();
        check(
            fails,
            &download(&o),
            &want,
            format!("{name} reduce_scatter {op}"),
        );
    }
    let b = block_on(pg.broadcast(upload(s, &data), 0).unwrap()).unwrap();
    check(fails, &download(&b), &data, format!("{name} broadcast"));
    let (i, o) = block_on(pg.all_gather(upload(s, &data), upload(s, &poison)).unwrap()).unwrap();
    check(fails, &download(&o), &data, format!("{name} all_gather"));
    check(
        fails,
        &download(&i),
        &data,
        format!("{name} all_gather input untouched"),
    );
    let (_, o) = block_on(pg.all_to_all(upload(s, &data), upload(s, &poison)).unwrap()).unwrap();
    check(fails, &download(&o), &data, format!("{name} all_to_all"));
    let (_, o) = block_on(
        pg.send_recv(upload(s, &data), upload(s, &poison), 0)
            .unwrap(),
    )
    .unwrap();
    check(
        fails,
        &download(&o),
        &data,
        format!("{name} send_recv to self"),
    );
}

fn check<T: PartialEq + std::fmt::Debug>(
    fails: &mut Vec<String>,
    got: &[T],
    want: &[T],
    what: String,
) {
    if got.len() != want.len() {
        fails.push(format!(
            "{what}: {} elements, expected {}",
            got.len(),
            want.len()
        ));
        return;
    }
    let bad: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
    if let Some(&i) = bad.first() {
        fails.push(format!(
            "{what}: {} of {} elements differ; first at {i}: got {:?}, expected {:?}",
            bad.len(),
            got.len(),
            got[i],
            want[i]
        ));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_every_op_and_dtype_one_rank() {
    let dev = device0();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = group("ops");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let n = 4099;
    let mut fails = Vec::new();
    every_op::<f32>(&pg, &s, &mut || rng.gen_range(-1e3f32..1e3), n, &mut fails);
    every_op::<f64>(&pg, &s, &mut || rng.gen_range(-1e6f64..1e6), n, &mut fails);
    every_op::<f16>(
        &pg,
        &s,
        &mut || f16::from_f32(rng.gen_range(-60f32..60.0)),
        n,
        &mut fails,
    );
    every_op::<bf16>(
        &pg,
        &s,
        &mut || bf16::from_f32(rng.gen_range(-1e3f32..1e3)),
        n,
        &mut fails,
    );
    every_op::<i8>(&pg, &s, &mut || rng.gen(), n, &mut fails);
    every_op::<u8>(&pg, &s, &mut || rng.gen(), n, &mut fails);
    every_op::<i32>(&pg, &s, &mut || rng.gen(), n, &mut fails);
    every_op::<i64>(&pg, &s, &mut || rng.gen(), n, &mut fails);
    // Even and odd counts of 8-byte floats.
    every_op::<f64>(
        &pg,
        &s,
        &mut || rng.gen_range(-1e6f64..1e6),
        4096,
        &mut fails,
    );
    every_op::<f64>(&pg, &s, &mut || rng.gen_range(-1e6f64..1e6), 7, &mut fails);
    for f in &fails {
        println!("MISMATCH {f}");
    }
    assert!(
        fails.is_empty(),
        "{} mismatches (listed above)",
        fails.len()
    );
    // A large f32 all_reduce, bit for bit.
    let big: Vec<f32> = (0..(1 << 20) + 3).map(|_| rng.gen()).collect();
    let b = block_on(pg.all_reduce(upload(&s, &big), ReduceOp::Sum).unwrap()).unwrap();
    assert_eq!(download(&b), big);
    // The raw-pointer entry: memory owned elsewhere, described by pointer.
    let data: Vec<i32> = (0..1000).map(|_| rng.gen()).collect();
    let owner = upload(&s, &data);
    // SAFETY: `owner` holds 1000 i32 on device 0 and outlives the awaited op.
    let raw = unsafe {
        RawDeviceBuffer::new(
            owner.device_ptr(),
            owner.len(),
            DType::I32,
            owner.producer().clone(),
        )
    };
    let raw = block_on(pg.all_reduce(raw, ReduceOp::Max).unwrap()).unwrap();
    assert_eq!(raw.count(), 1000);
    assert_eq!(download(&owner), data);
    // Invalid arguments come back with the buffers.
    let short = pg
        .all_gather(upload(&s, &data), upload(&s, &data[..10]))
        .unwrap_err();
    assert!(
        matches!(short.error, WorkError::InvalidArgument { .. }),
        "{}",
        short.error
    );
    assert_eq!(download(&short.buffers.0), data);
    let bad = pg.broadcast(upload(&s, &data), 3).unwrap_err();
    assert!(
        matches!(bad.error, WorkError::InvalidArgument { .. }),
        "{}",
        bad.error
    );
    assert_eq!(download(&bad.buffers), data);
    println!(
        "every op x 8 dtypes: ok; comms created: {}",
        pg.nccl_comms_created()
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_completion_semantics() {
    let dev = device0();
    let k = Kernels::load(&dev).unwrap();
    let producer = dev.new_stream(StreamPriority::Normal).unwrap();
    let consumer = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = group("semantics");
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let data: Vec<f32> = (0..1 << 16).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let spin = Duration::from_millis(50);
    let mut report = Vec::new();
    for level in [
        "a: no wait",
        "b: stream-ordered",
        "c: await",
        "d: blocking wait",
    ] {
        let buf = upload(&producer, &data);
        producer.synchronize().unwrap();
        k.spin(&producer, spin).unwrap();
        let t0 = Instant::now();
        let work = pg.all_reduce(buf, ReduceOp::Sum).unwrap();
        let enq = t0.elapsed();
        let ev = work.end_event_handle();
        let t1 = Instant::now();
        let mut waited_at = None;
        let (done_after, kept) = match level {
            "a: no wait" => {
                let d = ev.event().query().unwrap();
                (d, Some(work))
            }
            "b: stream-ordered" => {
                let b = work.stream_ordered_on(&consumer).unwrap();
                waited_at = Some(t1.elapsed());
                let d = ev.event().query().unwrap();
                // The consumer kernel, issued on the stream-ordered stream,
                // reads the op's result.
                let mut out = consumer.alloc_zeros::<f32>(data.len()).unwrap();
                k.add_one(&consumer, b.slice(), &mut out).unwrap();
                let got = consumer.clone_dtoh(&out).unwrap();
                let want: Vec<f32> = data.iter().map(|x| x + 1.0).collect();
                assert_eq!(got, want, "consumer kernel after stream_ordered");
                drop(b);
                (d, None)
            }
            "c: await" => {
                let b = block_on(work).unwrap();
                let d = ev.event().query().unwrap();
                assert_eq!(download(&b), data);
                (d, None)
            }
            _ => {
                let b = work.wait_timeout(Duration::from_secs(10)).unwrap();
                let d = ev.event().query().unwrap();
                assert_eq!(download(&b), data);
                (d, None)
            }
        };
        let waited = waited_at.unwrap_or_else(|| t1.elapsed());
        let line = format!(
            "{level:<18} enqueue {:>8.1} us, wait {:>10.1} us, end event complete right after: {done_after}",
            enq.as_secs_f64() * 1e6,
            waited.as_secs_f64() * 1e6
        );
        println!("{line}");
        report.push(line);
        match level {
            "a: no wait" | "b: stream-ordered" => {
                assert!(!done_after, "{level}: returned before the GPU finished");
                assert!(waited < spin / 2, "{level} must not wait for the GPU");
            }
            _ => {
                assert!(done_after, "{level}: GPU finished when it returns");
                assert!(waited >= spin / 2, "{level} waited for the spin kernel");
            }
        }
        if let Some(w) = kept {
            assert_eq!(
                w.status(),
                WorkStatus::Pending,
                "done() is not true at enqueue"
            );
            let b = block_on(w).unwrap();
            assert_eq!(download(&b), data);
        }
    }
    if let Ok(dir) = std::env::var("CHORUS_REPORT_DIR") {
        let _ = std::fs::write(
            format!("{dir}/completion_semantics.txt"),
            report.join("\n") + "\n",
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_dropped_work_keeps_buffer_alive_and_memory_returns() {
    let dev = device0();
    let k = Kernels::load(&dev).unwrap();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = group("drop");
    // Warm up (pools, NCCL buffers) before the baseline.
    let w = block_on(
        pg.all_reduce(upload(&s, &[1f32; 1024]), ReduceOp::Sum)
            .unwrap(),
    )
    .unwrap();
    drop(w);
    dev.synchronize().unwrap();
    let (free0, _) = dev.memory_info().unwrap();
    let n = 16 << 20; // 64 MiB of f32
    let pending = || chorus::reactor::stats().pending();
    for round in 0..8 {
        let buf = DeviceBuffer::new(s.alloc_zeros::<f32>(n).unwrap()).unwrap();
        k.spin(&s, Duration::from_millis(30)).unwrap();
        let work = pg.all_reduce(buf, ReduceOp::Sum).unwrap();
        let ev = work.end_event_handle();
        let before = pending();
        drop(work);
        assert!(
            !ev.event().query().unwrap(),
            "round {round}: op still running"
        );
        // The work held the op; dropping it left the op (and its buffer)
        // in its communicator's retire queue, which a sweeper on the
        // reactor empties once the GPU finished (nobody lets go of later
        // ops here).
        assert!(
            pending() > before,
            "round {round}: a sweeper watches the op that holds the buffer"
        );
        // Wait for the GPU, then for the sweeper to retire the op.
        ev.event().synchronize().unwrap();
        let t0 = Instant::now();
        while pending() != 0 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::yield_now();
        }
        assert_eq!(pending(), 0, "released after the GPU finished");
    }
    dev.synchronize().unwrap();
    s.synchronize().unwrap();
    let (free1, _) = dev.memory_info().unwrap();
    println!(
        "free device memory before {} MiB, after 8 x 64 MiB dropped unfinished works {} MiB",
        free0 >> 20,
        free1 >> 20
    );
    assert!(
        free1 + (32 << 20) >= free0,
        "device memory must return to its starting level: {free0} -> {free1}"
    );
    // Forgetting a work is not UB either: the work holds the op, so its
    // buffer is leaked with it (never freed while the GPU may use it), like
    // any forgotten value; nothing is left with the reactor.
    let buf = DeviceBuffer::new(s.alloc_zeros::<f32>(n).unwrap()).unwrap();
    let work = pg.all_reduce(buf, ReduceOp::Sum).unwrap();
    let ev = work.end_event_handle();
    std::mem::forget(work);
    ev.event().synchronize().unwrap();
    let t0 = Instant::now();
    while pending() != 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::yield_now();
    }
    assert_eq!(pending(), 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_stream_ordered_ops_are_retired_as_the_loop_goes_and_the_last_by_the_sweeper() {
    let dev = device0();
    let k = Kernels::load(&dev).unwrap();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = group("retire");
    let data: Vec<f32> = (0..1024).map(|i| i as f32).collect();
    let mut buf = upload(&s, &data);
    let n = 4000;
    let mut most = 0;
    let events0 = chorus::test_util::end_events_created();
    for i in 0..n {
        let w = pg.all_reduce(buf, ReduceOp::Sum).unwrap();
        buf = w.stream_ordered().unwrap();
        // Every op is still in the stream the next one waits on; a kernel
        // now and then keeps the GPU behind for a while.
        if i % 1000 == 0 {
            k.spin(&s, Duration::from_millis(2)).unwrap();
        }
        most = most.max(pg.pending());
    }
    let left = pg.pending();
    let created = chorus::test_util::end_events_created() - events0;
    println!(
        "stream-ordered loop of {n}: at most {most} ops pending, {left} at the end; {created} end events created"
    );
    assert!(
        created <= 2 * most as u64 + 64,
        "the end-event pool reuses events once their ops are retired ({created} created)"
    );
    assert!(
        most < n / 2,
        "the loop's own thread retires finished ops as it goes ({most} pending at most)"
    );
    // Nobody lets go of more ops: the sweeper retires the rest.
    s.synchronize().unwrap();
    let t0 = Instant::now();
    while pg.pending() != 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(pg.pending(), 0, "the sweeper retired the last ops");
    let rec = pg.flight_record();
    assert!(
        rec.iter()
            .all(|r| r.state == chorus::flight_recorder::OpState::Completed),
        "every recorded op completed"
    );
    assert_eq!(download(&buf), data, "a sum over one rank keeps the data");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_communicator_counting() {
    device0();
    let st = store();
    let s = device0().new_stream(StreamPriority::Normal).unwrap();
    let data: Vec<f32> = (0..256).map(|i| i as f32 * 0.5 - 3.0).collect();
    // Lazy: nothing at creation.
    let a = lazy_group(&st, "count-a");
    let b = lazy_group(&st, "count-b");
    assert_eq!((a.nccl_comms_created(), b.nccl_comms_created()), (0, 0));
    for pg in [&a, &b] {
        for _ in 0..3 {
            let r = block_on(pg.all_reduce(upload(&s, &data), ReduceOp::Sum).unwrap()).unwrap();
            assert_eq!(download(&r), data);
        }
    }
    // One cache per group, even with the same members: one device-keyed
    // communicator each.
    assert_eq!((a.nccl_comms_created(), b.nccl_comms_created()), (1, 1));
    // A point-to-point op uses the pair key: one more, in that group only.
    let (_, r) = block_on(
        a.send_recv(upload(&s, &data), upload(&s, &[0f32; 256]), 0)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(download(&r), data);
    assert_eq!((a.nccl_comms_created(), b.nccl_comms_created()), (2, 1));
    // Later ops create none.
    for _ in 0..3 {
        drop(block_on(a.all_reduce(upload(&s, &data), ReduceOp::Max).unwrap()).unwrap());
        drop(
            block_on(
                a.send_recv(upload(&s, &data), upload(&s, &data), 0)
                    .unwrap(),
            )
            .unwrap(),
        );
        drop(block_on(b.broadcast(upload(&s, &data), 0).unwrap()).unwrap());
    }
    assert_eq!((a.nccl_comms_created(), b.nccl_comms_created()), (2, 1));
    // Eager: the device given at creation creates the communicator in build.
    let e = group("count-eager");
    assert_eq!(e.nccl_comms_created(), 1);
    drop(block_on(e.all_reduce(upload(&s, &data), ReduceOp::Sum).unwrap()).unwrap());
    assert_eq!(e.nccl_comms_created(), 1);
    // A subgroup is split from the parent's communicator (one creation in
    // the subgroup, none in the parent).
    let sub = block_on(e.new_group(&[0]))
        .unwrap()
        .expect("rank 0 is a member");
    assert_eq!(sub.nccl_comms_created(), 1);
    assert_eq!(e.nccl_comms_created(), 1);
    let r = block_on(sub.all_reduce(upload(&s, &data), ReduceOp::Sum).unwrap()).unwrap();
    assert_eq!(download(&r), data);
    assert_eq!(sub.nccl_comms_created(), 1);
    println!(
        "created: a={} b={} eager={} sub={}",
        a.nccl_comms_created(),
        b.nccl_comms_created(),
        e.nccl_comms_created(),
        sub.nccl_comms_created()
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_blocking_wait_timeout_aborts_the_communicator() {
    let dev = device0();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = group("timeout");
    // Upload first: a pageable copy would wait for the held stream.
    let buf = upload(&s, &[1f32, 2.0, 3.0]);
    s.synchronize().unwrap();
    let hold = s.hold(Duration::from_secs(3)).unwrap();
    let work = pg.all_reduce(buf, ReduceOp::Sum).unwrap();
    let ev = work.end_event_handle();
    let t0 = Instant::now();
    let err = work
        .wait_timeout(Duration::from_millis(100))
        .unwrap_err()
        .error;
    println!("blocking wait gave up after {:?}: {err}", t0.elapsed());
    assert!(
        matches!(err, WorkError::OpTimeout { after, .. } if after == Duration::from_millis(100)),
        "the timeout the wait was given: {err:?}"
    );
    assert!(pg.error().is_some(), "the group is failed");
    // Later ops are refused with their buffers.
    let r = pg
        .all_reduce(upload(&s, &[5f32]), ReduceOp::Sum)
        .unwrap_err();
    println!("later op: {}", r.error);
    hold.release();
    ev.event().synchronize().unwrap();
    dev.synchronize().unwrap();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_cuda_library_absent_paths_are_typed() {
    // On the GPU machine: a device op on a device that does not exist is a
    // typed error, not a panic.
    let st = store();
    let pg = lazy_group(&st, "nodev");
    let e = block_on(pg.init_device(4096)).unwrap_err();
    println!("{e}");
    assert!(e.to_string().contains("4096"), "{e}");
}

/// Long ops (0.2, 1, 10, 30 ms of GPU time before the op) awaited under
/// `futures::executor::block_on`, a tokio current-thread and a multi-thread
/// runtime, and through `wait_timeout`, three times each (so the later
/// rounds run with an expected end and a pre-wake; at 0.2 ms, shorter than
/// the pre-wake's lead, the future watches from its first poll): every
/// result is the data, and the end event has completed when the wait
/// returns (GPU finished, never earlier). Timings belong to `wake_probe`.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_long_ops_on_every_executor_return_the_data_once_the_gpu_finished() {
    let dev = device0();
    let k = Kernels::load(&dev).unwrap();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = group("long-ops");
    let ct = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let data: Vec<f32> = (0..4096).map(|i| i as f32 * 0.25).collect();
    let mut buf = upload(&s, &data);
    for us in [200u64, 1_000, 10_000, 30_000] {
        let ms = us as f64 / 1e3;
        for how in ["block_on", "tokio-ct", "tokio-mt", "wait_timeout"] {
            for round in 0..3 {
                k.spin(&s, Duration::from_micros(us)).unwrap();
                let t0 = Instant::now();
                let work = pg.all_reduce(buf, ReduceOp::Max).unwrap();
                let ev = work.end_event_handle();
                let back = match how {
                    "block_on" => block_on(work),
                    "tokio-ct" => ct.block_on(work),
                    "tokio-mt" => mt.block_on(async { tokio::spawn(work).await.unwrap() }),
                    _ => work.wait_timeout(Duration::from_secs(30)),
                }
                .unwrap_or_else(|e| panic!("{ms} ms {how} round {round}: {e}"));
                assert!(
                    ev.event().query().unwrap(),
                    "{ms} ms {how} round {round}: returned before the GPU finished"
                );
                assert!(
                    t0.elapsed()
                        >= Duration::from_micros(us).saturating_sub(Duration::from_micros(200)),
                    "{ms} ms {how} round {round}: returned before the op could have run"
                );
                assert_eq!(download(&back), data, "{ms} ms {how} round {round}");
                buf = back;
            }
        }
    }
}

/// A buffer that notes, when it is dropped, whether the GPU work that
/// precedes its op (an event recorded after it) had ended.
#[derive(Debug)]
struct DropWatched {
    buf: DeviceBuffer<f32>,
    after: Arc<chorus::Event>,
    early: Arc<std::sync::atomic::AtomicBool>,
    dropped: Arc<std::sync::atomic::AtomicBool>,
}

// SAFETY: every method delegates to `buf`, a device buffer this value
// owns (and so keeps allocated) for its whole life.
unsafe impl DeviceMem for DropWatched {
    fn device_ptr(&self) -> u64 {
        self.buf.device_ptr()
    }
    fn count(&self) -> usize {
        self.buf.count()
    }
    fn dtype(&self) -> DType {
        DType::F32
    }
    fn stream(&self) -> &Stream {
        self.buf.stream()
    }
}

impl Drop for DropWatched {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        if !matches!(self.after.query(), Ok(true)) {
            self.early.store(true, Ordering::SeqCst);
        }
        self.dropped.store(true, Ordering::SeqCst);
    }
}

/// Works let go of in the other order than they were submitted: the later
/// op, still running, is dropped first, then an earlier one that finished.
/// The earlier one's end must not release the later one's buffer.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_works_dropped_out_of_order_free_nothing_early() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dev = device0();
    let k = Kernels::load(&dev).unwrap();
    let fast = dev.new_stream(StreamPriority::Normal).unwrap();
    let slow = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = group("drop-order");
    let warm = block_on(
        pg.all_reduce(upload(&fast, &[1f32; 64]), ReduceOp::Sum)
            .unwrap(),
    );
    drop(warm.unwrap());
    let pending = || chorus::reactor::stats().pending();
    let early = Arc::new(AtomicBool::new(false));
    for round in 0..4 {
        let earlier = pg
            .all_reduce(upload(&fast, &[1f32; 1024]), ReduceOp::Sum)
            .unwrap();
        k.spin(&slow, Duration::from_millis(100)).unwrap();
        let after = Arc::new(dev.new_event().unwrap());
        after.record(&slow).unwrap();
        let dropped = Arc::new(AtomicBool::new(false));
        let later = DropWatched {
            buf: DeviceBuffer::new(slow.alloc_zeros::<f32>(1 << 20).unwrap()).unwrap(),
            after: after.clone(),
            early: early.clone(),
            dropped: dropped.clone(),
        };
        let later = pg.all_reduce(later, ReduceOp::Sum).unwrap();
        drop(later);
        earlier.end_event().synchronize().unwrap();
        drop(earlier);
        // Long enough for the retire queue's sweeper to have looked.
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !early.load(Ordering::SeqCst),
            "round {round}: a running op's buffer was released"
        );
        after.synchronize().unwrap();
        let t0 = Instant::now();
        while !dropped.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            dropped.load(Ordering::SeqCst),
            "round {round}: released once finished"
        );
        while pending() != 0 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::yield_now();
        }
    }
    assert!(!early.load(Ordering::SeqCst));
}

/// Ops awaited after the GPU already ran them all: the first one's query
/// (and one of the newest op's end event) tells that the stream ran dry,
/// and the others are known to have ended with no query of their own. Ops
/// awaited while the GPU still runs them are never taken as ended early.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_ops_awaited_behind_the_gpu_are_known_ended_from_the_stream() {
    let dev = device0();
    let k = Kernels::load(&dev).unwrap();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = group("stream-progress");
    let data: Vec<Vec<f32>> = (0..16)
        .map(|i| (0..1024).map(|j| (i * 1024 + j) as f32).collect())
        .collect();
    for round in 0..3 {
        let works: Vec<_> = data
            .iter()
            .map(|d| pg.all_reduce(upload(&s, d), ReduceOp::Sum).unwrap())
            .collect();
        works.last().unwrap().end_event().synchronize().unwrap();
        let before = chorus::test_util::ended_without_query();
        for (i, w) in works.into_iter().enumerate() {
            let back = block_on(w).unwrap_or_else(|e| panic!("round {round} op {i}: {e}"));
            assert_eq!(download(&back), data[i], "round {round} op {i}");
        }
        let known = chorus::test_util::ended_without_query() - before;
        assert!(
            known >= 15,
            "round {round}: {known} of 16 ops known to have ended without a query (want 15)"
        );
    }
    // Behind a long kernel, later ops still run when the first is awaited:
    // each one's data is right and its end event complete when it returns.
    for round in 0..3 {
        k.spin(&s, Duration::from_millis(5)).unwrap();
        let works: Vec<_> = data
            .iter()
            .map(|d| pg.all_reduce(upload(&s, d), ReduceOp::Sum).unwrap())
            .collect();
        for (i, w) in works.into_iter().enumerate() {
            let ev = w.end_event_handle();
            let back = block_on(w).unwrap_or_else(|e| panic!("spin round {round} op {i}: {e}"));
            assert!(
                ev.event().query().unwrap(),
                "spin round {round} op {i}: returned before the GPU finished"
            );
            assert_eq!(download(&back), data[i], "spin round {round} op {i}");
        }
    }
}
