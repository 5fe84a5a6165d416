//! The GGUF weight formats the kernels multiply in place, by ggml type id,
//! with their block geometry.

use crate::error::{CoreError, CoreResult};

/// A supported weight format, by its ggml type id (`gguf.GGMLQuantizationType`).
///
/// The float formats (`F32`, `F16`, `BF16`) are "blocks" of one value; the
/// others are ggml's block layouts (see `unpack.rs` for each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    IQ4NL,
    IQ4XS,
    MXFP4,
}

/// Every supported format, in ggml id order.
pub const ALL: [QuantType; 16] = [
    QuantType::F32,
    QuantType::F16,
    QuantType::Q4_0,
    QuantType::Q4_1,
    QuantType::Q5_0,
    QuantType::Q5_1,
    QuantType::Q8_0,
    QuantType::Q2K,
    QuantType::Q3K,
    QuantType::Q4K,
    QuantType::Q5K,
    QuantType::Q6K,
    QuantType::IQ4NL,
    QuantType::IQ4XS,
    QuantType::BF16,
    QuantType::MXFP4,
];

impl QuantType {
    /// The format of ggml type id `id` (as `gguf.GGMLQuantizationType`).
    pub fn from_ggml(id: u32) -> CoreResult<Self> {
        ALL.iter()
            .copied()
            .find(|t| t.ggml_id() == id)
            .ok_or_else(|| {
                CoreError::option(
                    "qtype",
                    format!(
                        "ggml type {id} is not a supported weight format ({})",
                        ALL.map(QuantType::name).join(", ")
                    ),
                )
            })
    }

    /// The ggml type id.
    pub fn ggml_id(self) -> u32 {
        match self {
            QuantType::F32 => 0,
            QuantType::F16 => 1,
            QuantType::Q4_0 => 2,
            QuantType::Q4_1 => 3,
            QuantType::Q5_0 => 6,
            QuantType::Q5_1 => 7,
            QuantType::Q8_0 => 8,
            QuantType::Q2K => 10,
            QuantType::Q3K => 11,
            QuantType::Q4K => 12,
            QuantType::Q5K => 13,
            QuantType::Q6K => 14,
            QuantType::IQ4NL => 20,
            QuantType::IQ4XS => 23,
            QuantType::BF16 => 30,
            QuantType::MXFP4 => 39,
        }
    }

    /// The name ggml gives the format.
    pub fn name(self) -> &'static str {
        match self {
            QuantType::F32 => "F32",
            QuantType::F16 => "F16",
            QuantType::BF16 => "BF16",
            QuantType::Q4_0 => "Q4_0",
            QuantType::Q4_1 => "Q4_1",
            QuantType::Q5_0 => "Q5_0",
            QuantType::Q5_1 => "Q5_1",
            QuantType::Q8_0 => "Q8_0",
            QuantType::Q2K => "Q2_K",
            QuantType::Q3K => "Q3_K",
            QuantType::Q4K => "Q4_K",
            QuantType::Q5K => "Q5_K",
            QuantType::Q6K => "Q6_K",
            QuantType::IQ4NL => "IQ4_NL",
            QuantType::IQ4XS => "IQ4_XS",
            QuantType::MXFP4 => "MXFP4",
        }
    }

    /// Values per block.
    pub fn block_values(self) -> usize {
        match self {
            QuantType::F32 | QuantType::F16 | QuantType::BF16 => 1,
            QuantType::Q4_0
            | QuantType::Q4_1
            | QuantType::Q5_0
            | QuantType::Q5_1
            | QuantType::Q8_0
            | QuantType::IQ4NL
            | QuantType::MXFP4 => 32,
            QuantType::Q2K
            | QuantType::Q3K
            | QuantType::Q4K
            | QuantType::Q5K
            | QuantType::Q6K
            | QuantType::IQ4XS => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantType::F32 => 4,
            QuantType::F16 | QuantType::BF16 => 2,
            QuantType::MXFP4 => 17,
            QuantType::Q4_0 | QuantType::IQ4NL => 18,
            QuantType::Q4_1 => 20,
            QuantType::Q5_0 => 22,
            QuantType::Q5_1 => 24,
            QuantType::Q8_0 => 34,
            QuantType::Q2K => 84,
            QuantType::Q3K => 110,
            QuantType::Q4K => 144,
            QuantType::Q5K => 176,
            QuantType::Q6K => 210,
            QuantType::IQ4XS => 136,
        }
    }

    /// Whether the values are floats stored one by one (no blocks, no codes).
    pub fn is_float(self) -> bool {
        matches!(self, QuantType::F32 | QuantType::F16 | QuantType::BF16)
    }

    /// Values sharing one scale (and one offset): a block, or a K-quant's sub-block.
    pub(crate) fn group_values(self) -> usize {
        match self {
            QuantType::Q2K | QuantType::Q3K | QuantType::Q6K => 16,
            QuantType::F32 | QuantType::F16 | QuantType::BF16 => 1,
            _ => 32,
        }
    }

    /// Whether a value is `scale * code - offset` (else `scale * code`).
    pub(crate) fn has_offsets(self) -> bool {
        matches!(
            self,
            QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q2K | QuantType::Q4K | QuantType::Q5K
        )
    }

    /// Bytes of one row of `cols` values, or an error when `cols` is not a
    /// whole number of blocks (or the row would not fit in memory).
    pub fn row_bytes(self, cols: usize) -> CoreResult<usize> {
        if cols == 0 || !cols.is_multiple_of(self.block_values()) {
            return Err(CoreError::Shape(format!(
                "{cols} columns is not a whole number of {} blocks of {}",
                self.name(),
                self.block_values()
            )));
        }
        (cols / self.block_values())
            .checked_mul(self.block_bytes())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| CoreError::Shape(format!("{cols} columns is too many")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_unknown_ids_are_refused() {
        for t in ALL {
            assert_eq!(QuantType::from_ggml(t.ggml_id()), Ok(t));
        }
        for id in [4, 5, 9, 15, 16, 24, 38, 40, 99] {
            let err = QuantType::from_ggml(id).unwrap_err().to_string();
            assert!(err.contains(&format!("ggml type {id}")), "{err}");
        }
    }

    #[test]
    fn row_bytes_needs_whole_blocks() {
        assert_eq!(QuantType::Q8_0.row_bytes(64), Ok(68));
        assert_eq!(QuantType::F16.row_bytes(7), Ok(14));
        assert_eq!(QuantType::MXFP4.row_bytes(2880), Ok(90 * 17));
        assert_eq!(QuantType::from_ggml(39), Ok(QuantType::MXFP4));
        assert!(QuantType::Q4K.row_bytes(100).is_err());
        assert!(QuantType::Q4_0.row_bytes(0).is_err());
        assert!(QuantType::F32.row_bytes(usize::MAX).is_err());
    }
}
