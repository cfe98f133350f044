//! Batched NCCL ops and CUDA graph capture on a GPU, on a 1-rank
//! communicator. Ignored by default; run on the GPU machine with
//! `--include-ignored --test-threads=1`. They FAIL when no GPU is found.
#![forbid(unsafe_code)]

use std::time::Duration;

use chorus::test_util::{one_rank_group, reference_reduce, Reducible};
use chorus::DeviceElement;
use chorus::{Device, Stream, StreamPriority};
use chorus::{DeviceBuffer, ProcessGroup, ReduceOp, WorkError};
use futures::executor::block_on;
use half::bf16;
use rand::{Rng, SeedableRng};

fn device0() -> Device {
    Device::get(0).unwrap_or_else(|e| panic!("this GPU test needs a CUDA GPU: {e}"))
}

fn group(name: &str) -> ProcessGroup {
    one_rank_group(name, 0).unwrap_or_else(|e| panic!("group {name}: {e}"))
}

fn upload<T: DeviceElement + Copy>(s: &Stream, v: &[T]) -> DeviceBuffer<T> {
    DeviceBuffer::new(s.clone_htod(v).unwrap()).unwrap()
}

fn download<T: DeviceElement + Copy + Default>(b: &DeviceBuffer<T>) -> Vec<T> {
    b.producer().clone_dtoh(b.slice()).unwrap()
}

fn random<T: From<i8>>(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<T> {
    (0..n).map(|_| T::from(rng.gen_range(-8i8..=8))).collect()
}

fn reduced<T: Reducible + Clone>(op: ReduceOp, v: &[T]) -> Vec<T> {
    reference_reduce(op, &[v.to_vec()])
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_batched_mixed_ops_and_dtypes_share_one_end_event() {
    let dev = device0();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = group("grouped");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for round in 0..3 {
        let a: Vec<f32> = random(&mut rng, 4099);
        let b: Vec<i64> = random(&mut rng, 13);
        let c: Vec<i32> = random(&mut rng, 70001);
        let d: Vec<f64> = random(&mut rng, 5);
        let e: Vec<i32> = random(&mut rng, 8);
        let h: Vec<f32> = random(&mut rng, 12);
        let hb: Vec<bf16> = h.iter().map(|x| bf16::from_f32(*x)).collect();
        let (wa, wb, wc, wd, we, wh) = {
            let mut g = pg.batch();
            let wa = g.all_reduce(upload(&s, &a), ReduceOp::Sum).unwrap();
            let wb = g.all_reduce(upload(&s, &b), ReduceOp::Max).unwrap();
            let wc = g.broadcast(upload(&s, &c), 0).unwrap();
            let wd = g
                .all_gather(upload(&s, &d), upload(&s, &[0f64; 5]))
                .unwrap();
            let we = g
                .reduce_scatter(upload(&s, &e), upload(&s, &[0i32; 8]), ReduceOp::Min)
                .unwrap();
            let wh = g
                .all_to_all(upload(&s, &hb), upload(&s, &[bf16::ZERO; 12]))
                .unwrap();
            assert_eq!(g.len(), 6);
            g.launch().unwrap();
            (wa, wb, wc, wd, we, wh)
        };
        let (wa, wb) = (wa.into_work().unwrap(), wb.into_work().unwrap());
        assert_eq!(
            wa.end_event().as_raw(),
            wb.end_event().as_raw(),
            "the ops of a batch share one end event"
        );
        assert_eq!(wa.seq(), 6 * round + 1);
        assert_eq!(download(&block_on(wa).unwrap()), reduced(ReduceOp::Sum, &a));
        assert_eq!(download(&block_on(wb).unwrap()), reduced(ReduceOp::Max, &b));
        assert_eq!(download(&block_on(wc).unwrap()), c);
        assert_eq!(download(&block_on(wd).unwrap().1), d);
        assert_eq!(
            download(&block_on(we).unwrap().1),
            reduced(ReduceOp::Min, &e)
        );
        assert_eq!(download(&block_on(wh).unwrap().1), hb);
    }
    println!("batched: 3 rounds of 6 mixed ops bit-exact, one end event per batch");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_batch_with_a_bad_argument_fails_cleanly_and_the_next_works() {
    let dev = device0();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = group("badgroup");
    let x = vec![3f32; 100];
    let res: Result<(), WorkError> = pg.batched(|g| {
        let _ok = g.all_reduce(upload(&s, &x), ReduceOp::Sum)?;
        // Output of the wrong size: refused with both buffers.
        match g.all_gather(upload(&s, &x), upload(&s, &[0f32; 7])) {
            Ok(_) => panic!("a wrong all_gather output was accepted"),
            Err(rej) => {
                assert_eq!(download(&rej.buffers.0), x);
                Err(rej.error)
            }
        }
    });
    let err = res.unwrap_err();
    assert!(matches!(err, WorkError::InvalidArgument { .. }), "{err}");
    println!("bad argument: {err}");
    // Host buffers in a device batch are refused too.
    let mut g = pg.batch();
    let _d = g.all_reduce(upload(&s, &x), ReduceOp::Sum).unwrap();
    let rej = g.all_reduce(vec![1f32; 3], ReduceOp::Sum).unwrap_err();
    assert!(
        rej.error.to_string().contains("one backend"),
        "{}",
        rej.error
    );
    assert_eq!(rej.buffers, vec![1f32; 3]);
    g.launch().unwrap();
    assert!(pg.error().is_none());
    // The next batch works.
    let w = pg
        .batched(|g| {
            g.all_reduce(upload(&s, &x), ReduceOp::Avg)
                .map_err(WorkError::from)
        })
        .unwrap();
    assert_eq!(download(&block_on(w).unwrap()), x);
    println!("bad batch then good batch: ok");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_capture_a_batch_of_four_all_reduces_and_replay_five_times() {
    let dev = device0();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = group("capture");
    let n = 1 << 16;
    // Warm the communicator up outside the capture.
    let w = block_on(
        pg.all_reduce(upload(&s, &vec![1f32; n]), ReduceOp::Sum)
            .unwrap(),
    )
    .unwrap();
    drop(w);
    s.synchronize().unwrap();

    // Buffers are made before the capture: an upload on the capturing
    // stream would be captured too.
    let zeros = vec![0f32; n];
    let ar_bufs: Vec<_> = (0..4).map(|_| upload(&s, &zeros)).collect();
    let (ag_in, ag_out) = (upload(&s, &zeros), upload(&s, &zeros));
    let other = dev.new_stream(StreamPriority::Normal).unwrap();
    let stray = upload(&other, &[1f32; 4]);
    s.synchronize().unwrap();
    other.synchronize().unwrap();

    let mut cap = pg.capture(&s).unwrap();
    // While the capture holds the communicator, the group's other device
    // ops are refused.
    let refused = pg.all_reduce(stray, ReduceOp::Sum);
    // The refused buffer is kept until the capture ends: freeing device
    // memory on the capturing thread is not allowed during a capture.
    let _stray = match refused {
        Ok(_) => panic!("an op outside the capture was accepted during the capture"),
        Err(rej) => {
            assert!(rej.error.to_string().contains("captured"), "{}", rej.error);
            println!("during capture: {}", rej.error);
            rej.buffers
        }
    };
    let (ars, ag) = cap
        .batch(|g| {
            let mut ars = Vec::new();
            for b in ar_bufs {
                ars.push(g.all_reduce(b, ReduceOp::Sum)?);
            }
            let ag = g.all_gather(ag_in, ag_out)?;
            Ok((ars, ag))
        })
        .unwrap();
    let mut graph = cap.finish().unwrap();
    // After the capture the communicator takes ops again.
    let w = block_on(
        pg.all_reduce(upload(&s, &[2f32; 4]), ReduceOp::Sum)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(download(&w), vec![2f32; 4]);

    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    for replay in 0..5 {
        // New inputs in the graph's own buffers, then a replay.
        let mut inputs = Vec::new();
        for t in &ars {
            let v: Vec<f32> = random(&mut rng, n);
            let b = graph.buffers_mut(*t).unwrap();
            s.copy_htod(&v, b.slice_mut()).unwrap();
            inputs.push(v);
        }
        let agv: Vec<f32> = random(&mut rng, n);
        {
            let bufs = graph.buffers_mut(ag).unwrap();
            s.copy_htod(&agv, bufs.0.slice_mut()).unwrap();
            s.copy_htod(&zeros, bufs.1.slice_mut()).unwrap();
        }
        graph.launch(&s).unwrap();
        graph.done_event().synchronize().unwrap();
        for (t, v) in ars.iter().zip(&inputs) {
            let b = graph.buffers(*t).unwrap();
            assert_eq!(s.clone_dtoh(b.slice()).unwrap(), *v, "replay {replay}");
        }
        let bufs = graph.buffers(ag).unwrap();
        assert_eq!(
            s.clone_dtoh(bufs.1.slice()).unwrap(),
            agv,
            "replay {replay}: the captured all_gather wrote its output"
        );
    }
    drop(graph);
    println!(
        "capture: batch of 4 all_reduces + all_gather, 5 replays with fresh inputs, all correct"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_coalesced_all_reduce_is_one_op_with_its_buffers_in_order() {
    let dev = device0();
    let s1 = dev.new_stream(StreamPriority::Normal).unwrap();
    let s2 = dev.new_stream(StreamPriority::Normal).unwrap();
    let pg = group("coalesced");
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let lens = [1usize, 4099, 13, 262_144, 7];
    for (round, op) in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg]
        .into_iter()
        .enumerate()
    {
        let host: Vec<Vec<f32>> = lens.iter().map(|&n| random(&mut rng, n)).collect();
        // Two producer streams: the op waits for both.
        let bufs: Vec<DeviceBuffer<f32>> = host
            .iter()
            .enumerate()
            .map(|(i, v)| upload(if i % 2 == 0 { &s1 } else { &s2 }, v))
            .collect();
        let w = pg.all_reduce_coalesced(bufs, op).unwrap();
        let seq = w.seq();
        assert_eq!(w.context().op, "all_reduce_coalesced");
        let out = if round == 1 {
            // StreamOrdered: the buffers come back at once; reading them on
            // their own streams is ordered after the op.
            w.stream_ordered().unwrap()
        } else {
            block_on(w).unwrap()
        };
        assert_eq!(out.len(), lens.len());
        for (i, (b, v)) in out.iter().zip(&host).enumerate() {
            assert_eq!(download(b), reduced(op, v), "round {round}, buffer {i}");
        }
        // One sequence number for the whole op.
        let next = pg
            .all_reduce(upload(&s1, &[1f32, 2.0]), ReduceOp::Sum)
            .unwrap();
        assert_eq!(next.seq(), seq + 1);
        block_on(next).unwrap();
    }
    // No buffer: refused with nothing lost, and the group still works.
    let rej = pg
        .all_reduce_coalesced(Vec::<DeviceBuffer<f32>>::new(), ReduceOp::Sum)
        .unwrap_err();
    assert!(
        matches!(rej.error, WorkError::InvalidArgument { .. }),
        "{}",
        rej.error
    );
    let w = pg
        .all_reduce_coalesced(vec![upload(&s1, &[3i32, 4])], ReduceOp::Sum)
        .unwrap();
    let out = block_on(w).unwrap();
    assert_eq!(download(&out[0]), vec![3, 4]);
    eprintln!(
        "coalesced: 3 rounds of {} buffers on 2 streams OK",
        lens.len()
    );
}

/// The works of a batch's f32 ops.
type BatchWorks = Vec<chorus::Batched<chorus::DeviceWork<DeviceBuffer<f32>>>>;

/// A batch of `n` f32 all_reduce(Sum)s staged behind a spin kernel of
/// `len` on their producer stream `s` (so the batch still runs when it is
/// awaited), with the data each should end with.
fn spun_batch(
    pg: &ProcessGroup,
    s: &Stream,
    kernels: &chorus::test_util::Kernels,
    len: Duration,
    n: usize,
) -> (BatchWorks, Vec<Vec<f32>>) {
    let data: Vec<Vec<f32>> = (0..n)
        .map(|k| (0..257).map(|i| (i * (k + 1)) as f32 * 0.5).collect())
        .collect();
    // Upload before the spin: a pageable copy would wait behind it.
    let bufs: Vec<DeviceBuffer<f32>> = data.iter().map(|d| upload(s, d)).collect();
    kernels.spin(s, len).unwrap();
    let works = pg
        .batched(|g| {
            bufs.into_iter()
                .map(|b| g.all_reduce(b, ReduceOp::Sum).map_err(|r| r.error))
                .collect::<Result<Vec<_>, WorkError>>()
        })
        .unwrap();
    (works, data)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_a_long_batch_wakes_each_of_its_works_on_every_executor_and_through_wait_timeout() {
    let dev = device0();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let kernels = chorus::test_util::Kernels::load(&dev).unwrap();
    let pg = group("long-group");
    let mt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let ct = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let (prewakes_before, _) = chorus::test_util::prewake_counts();
    for ms in [1u64, 10, 30] {
        let len = Duration::from_millis(ms);
        // block_on, one thread per work, all waiting at once.
        let (works, data) = spun_batch(&pg, &s, &kernels, len, 4);
        let outs: Vec<Vec<f32>> = std::thread::scope(|sc| {
            let hs: Vec<_> = works
                .into_iter()
                .map(|w| sc.spawn(move || download(&block_on(w).unwrap())))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(outs, data, "{ms} ms, block_on on 4 threads");

        // tokio current-thread: every work joined on one task.
        let (works, data) = spun_batch(&pg, &s, &kernels, len, 4);
        let outs = ct.block_on(futures::future::join_all(works));
        let outs: Vec<Vec<f32>> = outs.into_iter().map(|r| download(&r.unwrap())).collect();
        assert_eq!(outs, data, "{ms} ms, tokio current-thread");

        // tokio multi-thread: one task per work.
        let (works, data) = spun_batch(&pg, &s, &kernels, len, 4);
        let outs: Vec<Vec<f32>> = mt.block_on(async {
            let hs: Vec<_> = works.into_iter().map(|w| tokio::spawn(w)).collect();
            let mut outs = Vec::new();
            for h in hs {
                outs.push(download(&h.await.unwrap().unwrap()));
            }
            outs
        });
        assert_eq!(outs, data, "{ms} ms, tokio multi-thread");

        // wait_timeout, one after another; the works are per op, the
        // completion level explicit: pending while the GPU runs the batch,
        // finished for every work once one has seen the batch end.
        let (works, data) = spun_batch(&pg, &s, &kernels, len, 4);
        let works: Vec<_> = works.into_iter().map(|w| w.into_work().unwrap()).collect();
        let seqs: Vec<u64> = works.iter().map(|w| w.seq()).collect();
        assert!(
            seqs.windows(2).all(|p| p[1] == p[0] + 1),
            "each op of the batch has its own sequence number: {seqs:?}"
        );
        assert_eq!(
            works[0].status(),
            chorus::WorkStatus::Pending,
            "{ms} ms: not finished at enqueue"
        );
        let mut works = works.into_iter();
        let first = works.next().unwrap();
        let mut outs = vec![download(
            &first.wait_timeout(Duration::from_secs(10)).unwrap(),
        )];
        for w in works {
            assert_eq!(w.status(), chorus::WorkStatus::Finished, "{ms} ms");
            outs.push(download(&w.wait_timeout(Duration::from_secs(10)).unwrap()));
        }
        assert_eq!(outs, data, "{ms} ms, wait_timeout");
    }
    // Groups of one shape are learned as a lone op's are: the later ones
    // are woken ahead of their expected end (nothing but batches ran here).
    let (prewakes, hits) = chorus::test_util::prewake_counts();
    assert!(
        prewakes > prewakes_before,
        "no batch was pre-woken: {prewakes_before} -> {prewakes}"
    );
    println!(
        "pre-wakes of the batches: {} ({hits} seen ending, process-wide)",
        prewakes - prewakes_before
    );
    println!("batches of 4 behind 1, 10 and 30 ms: block_on x4 threads, tokio current-thread, tokio multi-thread, wait_timeout all correct");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_an_aborted_batch_fails_each_waiting_work_as_its_own_op() {
    let dev = device0();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let kernels = chorus::test_util::Kernels::load(&dev).unwrap();
    let pg = group("aborted-group");
    let (works, _) = spun_batch(&pg, &s, &kernels, Duration::from_secs(2), 3);
    let works: Vec<_> = works.into_iter().map(|w| w.into_work().unwrap()).collect();
    let seqs: Vec<u64> = works.iter().map(|w| w.seq()).collect();
    let t0 = std::time::Instant::now();
    let errs: Vec<(u64, WorkError, bool)> = std::thread::scope(|sc| {
        let hs: Vec<_> = works
            .into_iter()
            .map(|w| {
                sc.spawn(move || {
                    let f = block_on(w).unwrap_err();
                    (f.error.context().seq, f.error, f.buffers.is_some())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        pg.abort("test: abort a running group");
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let waited = t0.elapsed();
    for ((seq, err, _), want) in errs.iter().zip(&seqs) {
        assert!(matches!(err, WorkError::Aborted { .. }), "{err}");
        assert_eq!(seq, want, "each work fails as its own op: {err}");
    }
    assert!(
        waited < Duration::from_millis(1500),
        "the waiting works woke at the abort, not at the GPU's end: {waited:?}"
    );
    assert!(pg.error().is_some());
    println!(
        "aborted batch: 3 waiting works failed as seq {seqs:?} after {waited:?}; buffers back: {:?}",
        errs.iter().map(|e| e.2).collect::<Vec<_>>()
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_a_batch_work_past_its_wait_timeout_times_the_batch_out() {
    let dev = device0();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let kernels = chorus::test_util::Kernels::load(&dev).unwrap();
    let pg = group("timed-out-group");
    let (works, _) = spun_batch(&pg, &s, &kernels, Duration::from_secs(2), 2);
    let mut works = works.into_iter();
    let (a, b) = (works.next().unwrap(), works.next().unwrap());
    let a = a.into_work().unwrap();
    let (sa, t0) = (a.seq(), std::time::Instant::now());
    let err = a.wait_timeout(Duration::from_millis(100)).unwrap_err();
    let waited = t0.elapsed();
    assert!(
        matches!(err.error, WorkError::OpTimeout { after, .. } if after == Duration::from_millis(100)),
        "the timeout the wait was given: {}",
        err.error
    );
    assert_eq!(err.error.context().seq, sa);
    assert!(waited < Duration::from_millis(1000), "{waited:?}");
    let err_b = block_on(b).unwrap_err();
    assert_eq!(err_b.error.context().seq, sa + 1, "{}", err_b.error);
    assert!(pg.error().is_some(), "the group is failed with the timeout");
    println!(
        "batch timed out by wait_timeout after {waited:?}: {}; its other op: {}",
        err.error, err_b.error
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_batch_works_taken_stream_ordered_dropped_or_awaited_each_get_their_own() {
    let dev = device0();
    let s = dev.new_stream(StreamPriority::Normal).unwrap();
    let kernels = chorus::test_util::Kernels::load(&dev).unwrap();
    let pg = group("mixed-levels");
    for _ in 0..3 {
        let (works, data) = spun_batch(&pg, &s, &kernels, Duration::from_millis(5), 3);
        let mut works = works.into_iter();
        let (a, b, c) = (
            works.next().unwrap(),
            works.next().unwrap(),
            works.next().unwrap(),
        );
        // Stream-ordered: back at once, ordered after the batch on its
        // producer stream (the download waits there).
        let a = a.into_work().unwrap().stream_ordered().unwrap();
        drop(b);
        let c = block_on(c).unwrap();
        assert_eq!(download(&a), data[0], "stream-ordered");
        assert_eq!(download(&c), data[2], "awaited after a sibling was dropped");
    }
    // The group stays healthy and later ops run.
    let d = vec![1.5f32; 33];
    let out = block_on(pg.all_reduce(upload(&s, &d), ReduceOp::Sum).unwrap()).unwrap();
    assert_eq!(download(&out), d);
    assert!(pg.error().is_none());
    println!(
        "3 batches: a work stream-ordered, one dropped, one awaited: all correct, group healthy"
    );
}
