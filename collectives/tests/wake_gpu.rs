//! Waking the caller after a GPU op of any length (docs/ARCHITECTURE.md,
//! "Waking on time"): ops whose lengths do not repeat, awaited on every
//! executor and through `wait_timeout`; errors and aborts while a driver
//! waiter sleeps on the op; waiters dropped mid-wait.
//!
//! The `gpu_` tests are ignored by default and run on the GPU machine with
//! `--include-ignored`; they FAIL when no GPU is found. Run them with
//! `--test-threads=1` (they share device 0 and the process-wide reactor).
//! Timings belong to `wake_probe`; these check data, completion levels and
//! what is kept, never how fast.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus::test_util::{one_rank_group, Kernels};
use chorus::{DType, DeviceBuffer, DeviceMem, ProcessGroup, ReduceOp, WorkError};
use chorus::{Device, Stream, StreamPriority};
use futures::executor::block_on;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

fn device0() -> Device {
    Device::get(0).unwrap_or_else(|e| panic!("this GPU test needs a CUDA GPU: {e}"))
}

fn group(name: &str) -> ProcessGroup {
    one_rank_group(name, 0).unwrap_or_else(|e| panic!("group {name}: {e}"))
}

fn upload(s: &Stream, v: &[f32]) -> DeviceBuffer<f32> {
    DeviceBuffer::new(s.clone_htod(v).unwrap()).unwrap()
}

fn download(b: &DeviceBuffer<f32>) -> Vec<f32> {
    b.producer().clone_dtoh(b.slice()).unwrap()
}

/// The threads of this process named `name` (from `/proc`).
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name)
                })
                .count()
        })
        .unwrap_or(0)
}

/// Waits (10 s at most) until the reactor and its driver waiters hold no
/// op.
fn until_settled() {
    let t0 = Instant::now();
    while chorus::reactor::stats().pending() != 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "ops left pending: {:?}",
            chorus::reactor::stats()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Ops of 1, 10 and 30 ms of GPU time before them, in random order (so
/// no op's length is what the one before it took), awaited under
/// `futures::executor::block_on`, a tokio current-thread runtime, in a
/// task on a multi-thread runtime, and through `wait_timeout`. Each op
/// reads what a kernel wrote after the wait (its input plus one): every
/// result is the reference, and the op's end event has completed when the
/// wait returns (GPU finished, never earlier). Long waits of such ops
/// sleep in the driver (the waiters' sleeps count).
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_ops_of_1_10_and_30_ms_in_random_order_return_their_data_once_finished_on_every_executor() {
    let dev = device0();
    let k = Kernels::load(&dev).unwrap();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = group("wake-random");
    let ct = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(45);
    let n = 4096;
    let waits0 = chorus::reactor::stats().waits;
    for how in ["block_on", "tokio-ct", "tokio-mt-task", "wait_timeout"] {
        let mut lens = [1u64, 10, 30, 1, 10, 30, 1, 10, 30];
        lens.shuffle(&mut rng);
        for (i, &ms) in lens.iter().enumerate() {
            let host: Vec<f32> = (0..n).map(|_| rng.gen_range(-1e3f32..1e3)).collect();
            let src = s.clone_htod(&host).unwrap();
            // The op's input is poisoned, then written by a kernel behind
            // `ms` of GPU time.
            let mut buf = upload(&s, &vec![f32::NAN; n]);
            k.spin(&s, Duration::from_millis(ms)).unwrap();
            k.add_one(&s, &src, buf.slice_mut()).unwrap();
            let t0 = Instant::now();
            let work = pg.all_reduce(buf, ReduceOp::Sum).unwrap();
            let ev = work.end_event_handle();
            let in_task = ev.clone();
            let what = format!("{how}, op {i} of {ms} ms");
            let back = match how {
                "block_on" => block_on(work),
                "tokio-ct" => ct.block_on(work),
                "tokio-mt-task" => mt.block_on(async {
                    tokio::spawn(async move {
                        let r = work.await;
                        // Seen from inside the task, right after the await.
                        assert!(r.is_err() || in_task.event().query().unwrap());
                        r
                    })
                    .await
                    .unwrap()
                }),
                _ => work.wait_timeout(Duration::from_secs(30)),
            }
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            let done_at = t0.elapsed();
            assert!(
                ev.event().query().unwrap(),
                "{what}: returned before the GPU finished"
            );
            assert!(
                back.slice().len() == n && done_at >= Duration::from_millis(ms) / 2,
                "{what}: returned after {done_at:?}, before the op could have run"
            );
            let want: Vec<f32> = host.iter().map(|x| x + 1.0).collect();
            assert_eq!(download(&back), want, "{what}");
        }
    }
    until_settled();
    let waits = chorus::reactor::stats().waits - waits0;
    println!("driver waiter sleeps: {waits}");
    assert!(waits > 0, "no wait slept in the driver");
}

/// The same ops on each executor, with the end event checked on the
/// awaiting thread the moment the wait returns: the level is GpuFinished.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_a_wait_returns_only_once_the_end_event_completed() {
    let dev = device0();
    let k = Kernels::load(&dev).unwrap();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = group("wake-level");
    let ct = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(4545);
    let mut buf = upload(&s, &[3f32; 1024]);
    for round in 0..12 {
        let ms = *[1u64, 10, 30].choose(&mut rng).unwrap();
        k.spin(&s, Duration::from_millis(ms)).unwrap();
        let work = pg.all_reduce(buf, ReduceOp::Sum).unwrap();
        let ev = work.end_event_handle();
        let back = match round % 3 {
            0 => block_on(work),
            1 => ct.block_on(work),
            _ => work.wait_timeout(Duration::from_secs(30)),
        }
        .unwrap_or_else(|e| panic!("round {round} ({ms} ms): {e}"));
        assert!(
            ev.event().query().unwrap(),
            "round {round} ({ms} ms): returned before the GPU finished"
        );
        buf = back;
    }
    assert_eq!(download(&buf), vec![3f32; 1024]);
    until_settled();
}

/// Four waiters of ops held on the GPU (their driver waiter asleep on the
/// earliest), on four executors; the group is aborted: every one of them
/// returns the abort at once, while the GPU still holds the ops. Released,
/// the ops end and the reactor holds nothing.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_an_abort_while_a_waiter_sleeps_in_the_driver_wakes_every_waiter() {
    let dev = device0();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = group("wake-abort");
    let warm = block_on(
        pg.all_reduce(upload(&s, &[1f32; 64]), ReduceOp::Sum)
            .unwrap(),
    );
    drop(warm.unwrap());
    s.synchronize().unwrap();
    let bufs: Vec<_> = (0..4).map(|i| upload(&s, &[i as f32; 256])).collect();
    s.synchronize().unwrap();
    let hold = s.hold(Duration::from_secs(20)).unwrap();
    let works: Vec<_> = bufs
        .into_iter()
        .map(|b| pg.all_reduce(b, ReduceOp::Sum).unwrap())
        .collect();
    let events: Vec<_> = works.iter().map(|w| w.end_event_handle()).collect();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    for (i, work) in works.into_iter().enumerate() {
        let tx = tx.clone();
        threads.push(std::thread::spawn(move || {
            let r = match i {
                0 => block_on(work),
                1 => tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(work),
                2 => tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(async { tokio::spawn(work).await.unwrap() }),
                _ => work.wait_timeout(Duration::from_secs(60)),
            };
            tx.send((i, r.map(|_| ()).map_err(|f| f.error), Instant::now()))
                .unwrap();
        }));
    }
    // Every waiter waits; the earliest op's driver waiter sleeps on it.
    let t0 = Instant::now();
    while chorus::reactor::stats().asleep == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no driver waiter slept: {:?}",
            chorus::reactor::stats()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(rx.try_recv().is_err(), "a waiter returned while the op ran");
    let aborted = Instant::now();
    pg.abort("the test aborts the group");
    for _ in 0..4 {
        let (i, r, at) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let e = r.expect_err("an aborted op returned data");
        println!("waiter {i}: {e} after {:?}", at - aborted);
        assert!(
            matches!(
                e,
                WorkError::Aborted { .. } | WorkError::OpTimeout { .. } | WorkError::Backend { .. }
            ),
            "waiter {i}: {e:?}"
        );
    }
    for t in threads {
        t.join().unwrap();
    }
    // The ops never ran: the GPU still holds them.
    assert!(!matches!(events[0].event().query(), Ok(true)));
    hold.release();
    for ev in &events {
        ev.event().synchronize().unwrap();
    }
    until_settled();
}

/// Whether an op has ended, asked when its buffer is dropped.
type Ended = Arc<std::sync::OnceLock<Box<dyn Fn() -> bool + Send + Sync>>>;

/// A buffer that notes, when it is dropped, whether its op had ended.
struct DropWatched {
    buf: DeviceBuffer<f32>,
    ended: Ended,
    early: Arc<AtomicBool>,
    dropped: Arc<AtomicBool>,
}

impl std::fmt::Debug for DropWatched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DropWatched").finish_non_exhaustive()
    }
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
        if !self.ended.get().is_some_and(|ended| ended()) {
            self.early.store(true, Ordering::SeqCst);
        }
        self.dropped.store(true, Ordering::SeqCst);
    }
}

/// Waiters dropped mid-wait (a `tokio::time::timeout` that fires while a
/// driver waiter sleeps on the op), twenty of them on ops of 5 ms: no
/// buffer is released before its op ended, every one is released after,
/// and the driver waiters stay a handful, not one per op.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_waiters_dropped_mid_wait_leak_no_thread_and_free_nothing_early() {
    let dev = device0();
    let k = Kernels::load(&dev).unwrap();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = group("wake-drop");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Waiters left idle by earlier tests of this process may serve these
    // ops too: the bound is on what the ops add.
    let named0 = threads_named("chorus-gpu-wait");
    let early = Arc::new(AtomicBool::new(false));
    let mut dropped = Vec::new();
    let mut last = None;
    for i in 0..20 {
        k.spin(&s, Duration::from_millis(5)).unwrap();
        let buf = DeviceBuffer::new(s.alloc_zeros::<f32>(1 << 18).unwrap()).unwrap();
        let ended: Ended = Arc::default();
        let d = Arc::new(AtomicBool::new(false));
        let watched = DropWatched {
            buf,
            ended: ended.clone(),
            early: early.clone(),
            dropped: d.clone(),
        };
        let work = pg.all_reduce(watched, ReduceOp::Sum).unwrap();
        let end = work.end_event_handle();
        let _ = ended.set(Box::new({
            let end = end.clone();
            move || matches!(end.event().query(), Ok(true))
        }));
        let r = rt.block_on(async { tokio::time::timeout(Duration::from_millis(1), work).await });
        assert!(r.is_err(), "op {i} ended within 1 ms of 5 ms of GPU time");
        dropped.push(d);
        last = Some(end);
    }
    let named = threads_named("chorus-gpu-wait");
    println!(
        "driver waiters after 20 dropped waits: {named} threads ({named0} before); {:?}",
        chorus::reactor::stats()
    );
    assert!(named <= named0.max(4), "{named} waiter threads");
    last.unwrap().event().synchronize().unwrap();
    until_settled();
    assert!(!early.load(Ordering::SeqCst), "a buffer was released early");
    let t0 = Instant::now();
    while !dropped.iter().all(|d| d.load(Ordering::SeqCst)) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "buffers kept after their ops ended"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(threads_named("chorus-gpu-wait") <= named0.max(4));
}

/// Run in a process of its own by the test below: a CUDA error (a kernel
/// that faults on the ops' producer stream, behind a hold) reaches four
/// waiters while a driver waiter sleeps on the earliest op: each returns
/// the error. Prints a line the parent looks for.
#[test]
#[ignore = "needs a CUDA GPU; run by gpu_a_cuda_error_while_a_waiter_sleeps_wakes_every_waiter"]
fn child_cuda_error_wakes_every_waiter() {
    if std::env::var_os("CHORUS_WAKE_ERROR_CHILD").is_none() {
        return;
    }
    let dev = device0();
    let k = Kernels::load(&dev).unwrap();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = group("wake-error");
    let warm = block_on(
        pg.all_reduce(upload(&s, &[1f32; 64]), ReduceOp::Sum)
            .unwrap(),
    );
    drop(warm.unwrap());
    let bufs: Vec<_> = (0..4).map(|i| upload(&s, &[i as f32; 256])).collect();
    s.synchronize().unwrap();
    let hold = s.hold(Duration::from_secs(20)).unwrap();
    k.trap(&s).unwrap();
    let works: Vec<_> = bufs
        .into_iter()
        .map(|b| pg.all_reduce(b, ReduceOp::Sum).unwrap())
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    for (i, work) in works.into_iter().enumerate() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let r = match i {
                0 => block_on(work),
                1 => tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(work),
                2 => tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(async { tokio::spawn(work).await.unwrap() }),
                _ => work.wait_timeout(Duration::from_secs(60)),
            };
            let _ = tx.send((i, r.map(|_| ()).map_err(|f| f.error)));
        });
    }
    let t0 = Instant::now();
    while chorus::reactor::stats().asleep == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no waiter slept");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        rx.try_recv().is_err(),
        "a waiter returned while the op was held"
    );
    let released = Instant::now();
    hold.release();
    for _ in 0..4 {
        let (i, r) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
        let e = r.expect_err("an op behind a faulted kernel returned data");
        println!("waiter {i} after {:?}: {e}", released.elapsed());
    }
    println!("CHILD-OK: every waiter woke with the CUDA error");
    // The context is unusable: leave without tearing anything down.
    std::process::exit(0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_a_cuda_error_while_a_waiter_sleeps_wakes_every_waiter() {
    let _ = device0();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_cuda_error_wakes_every_waiter",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CHORUS_WAKE_ERROR_CHILD", "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(
        out.status.success() && text.contains("CHILD-OK"),
        "the child failed: {:?}",
        out.status
    );
}
