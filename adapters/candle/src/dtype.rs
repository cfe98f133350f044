//! candle's dtypes as chorus's: the ones NCCL has a type for.

use candle_core::DType as CandleType;
use chorus::DType;

/// The chorus dtype of a candle dtype, if NCCL can move it.
pub(crate) fn chorus_dtype(d: CandleType) -> Option<DType> {
    Some(match d {
        CandleType::U8 => DType::U8,
        CandleType::U32 => DType::U32,
        CandleType::I32 => DType::I32,
        CandleType::I64 => DType::I64,
        CandleType::BF16 => DType::BF16,
        CandleType::F16 => DType::F16,
        CandleType::F32 => DType::F32,
        CandleType::F64 => DType::F64,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_nccl_has_maps_and_the_rest_do_not() {
        for (c, d) in [
            (CandleType::U8, DType::U8),
            (CandleType::U32, DType::U32),
            (CandleType::I32, DType::I32),
            (CandleType::I64, DType::I64),
            (CandleType::BF16, DType::BF16),
            (CandleType::F16, DType::F16),
            (CandleType::F32, DType::F32),
            (CandleType::F64, DType::F64),
        ] {
            assert_eq!(chorus_dtype(c), Some(d));
            assert_eq!(c.size_in_bytes(), d.size(), "{c:?}");
        }
        for c in [CandleType::I16, CandleType::F8E4M3] {
            assert_eq!(chorus_dtype(c), None);
        }
    }
}
