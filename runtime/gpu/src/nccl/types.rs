//! chorus's element types and reductions as NCCL's enums.

use chorus_core::{DType, ReduceOp};
use nccl_sys::sys::{ncclDataType_t, ncclRedOp_t};

/// NCCL's name for `d`.
pub(crate) fn raw_dtype(d: DType) -> ncclDataType_t {
    match d {
        DType::I8 => ncclDataType_t::ncclInt8,
        DType::U8 => ncclDataType_t::ncclUint8,
        DType::I32 => ncclDataType_t::ncclInt32,
        DType::U32 => ncclDataType_t::ncclUint32,
        DType::I64 => ncclDataType_t::ncclInt64,
        DType::U64 => ncclDataType_t::ncclUint64,
        DType::F16 => ncclDataType_t::ncclFloat16,
        DType::BF16 => ncclDataType_t::ncclBfloat16,
        DType::F32 => ncclDataType_t::ncclFloat32,
        DType::F64 => ncclDataType_t::ncclFloat64,
    }
}

/// NCCL's name for `r`.
pub(crate) fn raw_op(r: ReduceOp) -> ncclRedOp_t {
    match r {
        ReduceOp::Sum => ncclRedOp_t::ncclSum,
        ReduceOp::Prod => ncclRedOp_t::ncclProd,
        ReduceOp::Max => ncclRedOp_t::ncclMax,
        ReduceOp::Min => ncclRedOp_t::ncclMin,
        ReduceOp::Avg => ncclRedOp_t::ncclAvg,
    }
}
