//! Named host tensors: the exchange format between inputs, npy files, digests and backends.

use crate::spec::DType;
use xxhash_rust::xxh3::Xxh3;

/// Element data of a host tensor.
#[derive(Debug, Clone, Copy)]
pub enum HostData<'a> {
    /// Floats stored as f32, exactly representable in `dtype`.
    Float {
        /// Values.
        values: &'a [f32],
        /// Element type on the device and on disk.
        dtype: DType,
    },
    /// 32-bit integers.
    I32(&'a [i32]),
}

/// A borrowed tensor with its SPEC name and shape.
#[derive(Debug, Clone)]
pub struct NamedTensor<'a> {
    /// SPEC name (`logits`, `chosen_ids`, ...).
    pub name: &'static str,
    /// Dimensions, row-major.
    pub shape: Vec<usize>,
    /// Elements.
    pub data: HostData<'a>,
}

impl<'a> NamedTensor<'a> {
    /// A float tensor in `dtype`.
    pub fn float(name: &'static str, shape: Vec<usize>, values: &'a [f32], dtype: DType) -> Self {
        NamedTensor {
            name,
            shape,
            data: HostData::Float { values, dtype },
        }
    }

    /// An f32 tensor.
    pub fn f32(name: &'static str, shape: Vec<usize>, values: &'a [f32]) -> Self {
        Self::float(name, shape, values, DType::F32)
    }

    /// Element type name (`f32`, `bf16`, `f16`, `i32`).
    pub fn dtype_name(&self) -> &'static str {
        match self.data {
            HostData::Float { dtype, .. } => dtype.name(),
            HostData::I32(_) => "i32",
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self.data {
            HostData::Float { values, .. } => values.len(),
            HostData::I32(v) => v.len(),
        }
    }

    /// Whether the tensor has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `f` with consecutive little-endian byte chunks of the tensor in its dtype.
    pub fn for_each_le_chunk(&self, mut f: impl FnMut(&[u8])) {
        const CHUNK: usize = 1 << 16;
        let mut buf = Vec::with_capacity(CHUNK * 4);
        match self.data {
            HostData::Float { values, dtype } => {
                for part in values.chunks(CHUNK) {
                    buf.clear();
                    for &x in part {
                        match dtype {
                            DType::F32 => buf.extend_from_slice(&x.to_le_bytes()),
                            DType::Bf16 => {
                                buf.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes())
                            }
                            DType::F16 => {
                                buf.extend_from_slice(&half::f16::from_f32(x).to_le_bytes())
                            }
                        }
                    }
                    f(&buf);
                }
            }
            HostData::I32(values) => {
                for part in values.chunks(CHUNK) {
                    buf.clear();
                    for &x in part {
                        buf.extend_from_slice(&x.to_le_bytes());
                    }
                    f(&buf);
                }
            }
        }
    }

    /// The tensor's bytes (little-endian, in its dtype).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.for_each_le_chunk(|c| out.extend_from_slice(c));
        out
    }

    /// `xxh3:<16 hex>` of dtype name, shape and bytes: identifies the exact tensor.
    pub fn digest(&self) -> String {
        let mut h = Xxh3::new();
        h.update(self.dtype_name().as_bytes());
        for d in &self.shape {
            h.update(&(*d as u64).to_le_bytes());
        }
        self.for_each_le_chunk(|c| h.update(c));
        format!("xxh3:{:016x}", h.digest())
    }
}
