//! Tensors the adapter cannot use are refused with a typed error before
//! anything runs; no GPU needed.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use chorus::store::{InMemoryStore, Store};
use chorus::{ProcessGroup, ReduceOp};
use chorus_candle::{TensorError, TensorGroup};
use futures::executor::block_on;

fn one_rank() -> TensorGroup {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let pg = block_on(
        ProcessGroup::builder()
            .rank(0)
            .world_size(1)
            .store(store)
            .name("refusals")
            .build(),
    )
    .unwrap();
    TensorGroup::new(pg)
}

#[test]
fn a_cpu_tensor_is_named_with_its_dtype_shape_and_device() {
    let tp = one_rank();
    let t = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
    for r in [
        tp.all_reduce(&t, ReduceOp::Sum).map(drop),
        tp.broadcast(&t, 0).map(drop),
        tp.all_gather(&t).map(drop),
        tp.reduce_scatter(&t, ReduceOp::Sum).map(drop),
        tp.send(&t, 0).map(drop),
        tp.recv(&t, 0).map(drop),
        tp.buffer(&t).map(drop),
    ] {
        match r {
            Err(e @ TensorError::NotCuda { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("F32 [2, 3] on cpu"), "{msg}");
                assert!(msg.contains("on rank 0"), "{msg}");
                assert!(msg.contains("to_device"), "{msg}");
            }
            other => panic!("expected NotCuda, got {other:?}"),
        }
    }
    // Nothing was lost: the tensor is the caller's, unchanged.
    assert_eq!(t.sum_all().unwrap().to_scalar::<f32>().unwrap(), 0.0);
}
