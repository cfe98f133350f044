//! The adapter on a GPU, with a 1-rank group: every op against candle's own
//! arithmetic, in place and out of place, views with offsets, refusals.
//!
//! The `gpu_` tests are ignored by default and run on the GPU machine with
//! `--include-ignored`; they FAIL when no GPU is found.

use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device, Tensor, D};
use chorus::store::{InMemoryStore, Store};
use chorus::{ProcessGroup, ReduceOp};
use chorus_candle::{TensorError, TensorGroup};
use futures::executor::block_on;

fn cuda() -> Device {
    Device::new_cuda(0).unwrap_or_else(|e| panic!("this GPU test needs a CUDA GPU: {e}"))
}

fn group(name: &str) -> TensorGroup {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let pg = block_on(
        ProcessGroup::builder()
            .rank(0)
            .world_size(1)
            .store(store)
            .name(name)
            .device(0)
            .timeout(Duration::from_secs(60))
            .build(),
    )
    .unwrap();
    TensorGroup::new(pg)
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_dtype(DType::F64).unwrap() - b.to_dtype(DType::F64).unwrap())
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_every_op_agrees_with_candles_arithmetic() {
    let dev = cuda();
    let tp = group("candle-ops");
    let a = Tensor::randn(0f32, 1.0, (64, 48), &dev).unwrap();
    let want = ((&a * 3.0).unwrap() + 1.0).unwrap();

    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        // In place, stream-ordered: candle's next op reads the result
        // with no host wait in between.
        let x = want.to_dtype(dtype).unwrap();
        let y = tp
            .all_reduce(&x, ReduceOp::Sum)
            .unwrap()
            .stream_ordered()
            .unwrap();
        let z = (&y - &x.to_dtype(dtype).unwrap()).unwrap();
        assert_eq!(max_abs_diff(&z, &z.zeros_like().unwrap()), 0.0, "{dtype:?}");
        for op in [ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod] {
            let y = block_on(tp.all_reduce(&x, op).unwrap()).unwrap();
            assert_eq!(max_abs_diff(&y, &x), 0.0, "{dtype:?} {op}");
        }
        let y = block_on(tp.broadcast(&x, 0).unwrap()).unwrap();
        assert_eq!(max_abs_diff(&y, &x), 0.0);
    }
    for dtype in [DType::U8, DType::U32, DType::I64] {
        let x = Tensor::arange(0u32, 200, &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let y = block_on(tp.all_reduce(&x, ReduceOp::Max).unwrap()).unwrap();
        assert_eq!(max_abs_diff(&y, &x), 0.0, "{dtype:?}");
    }

    // Out of place, into fresh tensors of the right shape.
    let g = block_on(tp.all_gather(&want).unwrap()).unwrap();
    assert_eq!(g.dims(), &[64, 48]);
    assert_eq!(max_abs_diff(&g, &want), 0.0);
    let s = block_on(tp.reduce_scatter(&want, ReduceOp::Sum).unwrap()).unwrap();
    assert_eq!(s.dims(), &[64, 48]);
    assert_eq!(max_abs_diff(&s, &want), 0.0);
    let scalar = want.sum_all().unwrap();
    let g = block_on(tp.all_gather(&scalar).unwrap()).unwrap();
    assert_eq!(g.dims(), &[1]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_views_are_used_at_their_offset_and_strided_ones_refused() {
    let dev = cuda();
    let tp = group("candle-views");
    let a = Tensor::arange(0f32, 600., &dev)
        .unwrap()
        .reshape((20, 30))
        .unwrap();
    // Rows 5..9: contiguous, 150 elements into the storage.
    let rows = a.narrow(0, 5, 4).unwrap();
    let g = block_on(tp.all_gather(&rows).unwrap()).unwrap();
    assert_eq!(max_abs_diff(&g, &rows), 0.0);
    assert_eq!(
        g.get(0)
            .unwrap()
            .get(0)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap(),
        150.0
    );

    // Columns, or a transpose, are strided.
    for t in [a.narrow(D::Minus1, 2, 3).unwrap(), a.t().unwrap()] {
        match tp.all_reduce(&t, ReduceOp::Sum) {
            Err(e @ TensorError::NotContiguous { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("F32") && msg.contains("cuda:0"), "{msg}");
                assert!(msg.contains("contiguous()"), "{msg}");
            }
            other => panic!("expected NotContiguous, got {other:?}"),
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_refusals_are_typed_and_lose_nothing() {
    let dev = cuda();
    let tp = group("candle-refusals");
    let t = Tensor::ones((6, 2), DType::F32, &dev).unwrap();
    // No peer but this rank: sends and receives are refused by chorus.
    assert!(matches!(tp.send(&t, 0), Err(TensorError::Refused(_))));
    assert!(matches!(tp.recv(&t, 3), Err(TensorError::Refused(_))));
    assert!(matches!(tp.broadcast(&t, 1), Err(TensorError::Refused(_))));
    // Dtypes NCCL has no type for (made by a memset: candle has no
    // conversion kernel to them).
    for dtype in [DType::I16, DType::F8E4M3] {
        let t = Tensor::zeros((6, 2), dtype, &dev).unwrap();
        match tp.all_reduce(&t, ReduceOp::Sum) {
            Err(e @ TensorError::UnsupportedDType { .. }) => {
                assert!(e.to_string().contains("[6, 2] on cuda:0"), "{e}");
            }
            other => panic!("expected UnsupportedDType for {dtype:?}, got {other:?}"),
        }
    }
    // A scalar cannot be scattered.
    let scalar = t.sum_all().unwrap();
    assert!(matches!(
        tp.reduce_scatter(&scalar, ReduceOp::Sum),
        Err(TensorError::Shape { .. })
    ));
    // The tensor is intact and still usable.
    let y = block_on(tp.all_reduce(&t, ReduceOp::Sum).unwrap()).unwrap();
    assert_eq!(y.sum_all().unwrap().to_scalar::<f32>().unwrap(), 12.0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_the_work_keeps_the_tensor_alive() {
    let dev = cuda();
    let tp = group("candle-lifetime");
    let t = Tensor::full(7f32, (1 << 20,), &dev).unwrap();
    let w = tp.all_reduce(&t, ReduceOp::Sum).unwrap();
    drop(t); // the work holds the storage until the op's end event
    let y = w.wait_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(y.max(0).unwrap().to_scalar::<f32>().unwrap(), 7.0);
    // Work dropped unawaited: the op still completes safely.
    let t2 = Tensor::full(1f32, (1 << 20,), &dev).unwrap();
    drop(tp.all_reduce(&t2, ReduceOp::Sum).unwrap());
    drop(t2);
    dev.synchronize().unwrap();
}
