//! Just enough of a serialized `HloModuleProto` (what `Executable::optimized_program`
//! returns as format "hlo" or "hlo_with_config") to read a compiled module's structure:
//! computations, instructions with their shapes (layouts and memory spaces included),
//! operands, called computations, dot dimensions and precision, scalar constants and
//! custom-call targets. Field numbers are XLA's (`xla/service/hlo.proto`,
//! `xla/xla_data.proto`); every other field is skipped by the decoder. The suite's cost
//! model walks this (`grpo_conformance::cost`); [`collectives_of`] lists collectives.

use prost::Message;

/// `HloModuleProto`: the computations (callees before callers) and the entry's id.
#[derive(Clone, PartialEq, Message)]
pub struct HloModule {
    /// Name of the entry computation.
    #[prost(string, tag = "2")]
    pub entry_computation_name: String,
    /// Every computation of the module.
    #[prost(message, repeated, tag = "3")]
    pub computations: Vec<HloComputation>,
    /// Id of the entry computation.
    #[prost(int64, tag = "6")]
    pub entry_computation_id: i64,
}

/// `HloModuleProtoWithConfig` (format "hlo_with_config"): the module is field 1.
#[derive(Clone, PartialEq, Message)]
struct ModuleWithConfigProto {
    #[prost(message, optional, tag = "1")]
    module: Option<HloModule>,
}

/// `HloComputationProto`: instructions in dependency order and the root's id.
#[derive(Clone, PartialEq, Message)]
pub struct HloComputation {
    /// Name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Instructions, operands before their users.
    #[prost(message, repeated, tag = "2")]
    pub instructions: Vec<HloInstruction>,
    /// Id.
    #[prost(int64, tag = "5")]
    pub id: i64,
    /// Id of the root instruction.
    #[prost(int64, tag = "6")]
    pub root_id: i64,
}

/// `HloInstructionProto`, the fields the suite reads.
#[derive(Clone, PartialEq, Message)]
pub struct HloInstruction {
    /// Name (unique in the module).
    #[prost(string, tag = "1")]
    pub name: String,
    /// Opcode, e.g. `fusion`, `while`, `custom-call`, `dot`.
    #[prost(string, tag = "2")]
    pub opcode: String,
    /// Result shape (with layout: tiles and memory space).
    #[prost(message, optional, tag = "3")]
    pub shape: Option<Shape>,
    /// Where it came from (`op_name` carries the jax name stack).
    #[prost(message, optional, tag = "7")]
    pub metadata: Option<OpMetadata>,
    /// The value of a `constant`.
    #[prost(message, optional, tag = "8")]
    pub literal: Option<Literal>,
    /// Parameter number of a `parameter`.
    #[prost(int64, tag = "9")]
    pub parameter_number: i64,
    /// `kLoop`, `kOutput`, ... of a `fusion`.
    #[prost(string, tag = "11")]
    pub fusion_kind: String,
    /// Index of a `get-tuple-element`.
    #[prost(int64, tag = "13")]
    pub tuple_index: i64,
    /// Dimensions of a reduce, broadcast, transpose, ...
    #[prost(int64, repeated, tag = "14")]
    pub dimensions: Vec<i64>,
    /// Sizes of a `dynamic-slice`.
    #[prost(int64, repeated, tag = "20")]
    pub dynamic_slice_sizes: Vec<i64>,
    /// Dimension roles of a `convolution` (XLA:TPU writes matmuls as convolutions).
    #[prost(message, optional, tag = "16")]
    pub convolution_dimension_numbers: Option<ConvolutionDimensionNumbers>,
    /// Target of a `custom-call` (`tpu_custom_call` for Mosaic kernels).
    #[prost(string, tag = "28")]
    pub custom_call_target: String,
    /// Contracting and batch dimensions of a `dot`.
    #[prost(message, optional, tag = "30")]
    pub dot_dimension_numbers: Option<DotDimensionNumbers>,
    /// Instruction id (unique in the module).
    #[prost(int64, tag = "35")]
    pub id: i64,
    /// Operands, by instruction id.
    #[prost(int64, repeated, tag = "36")]
    pub operand_ids: Vec<i64>,
    /// Called computations (fusion body, while condition and body, branches, ...).
    #[prost(int64, repeated, tag = "38")]
    pub called_computation_ids: Vec<i64>,
    /// Backend configuration (TPU: JSON; a Mosaic kernel's body and declared cost).
    #[prost(bytes = "vec", tag = "43")]
    pub backend_config: Vec<u8>,
    /// Operand precision of a `dot` / `convolution`.
    #[prost(message, optional, tag = "51")]
    pub precision_config: Option<PrecisionConfig>,
    /// `LT`, `GT`, ... of a `compare`.
    #[prost(string, tag = "63")]
    pub comparison_direction: String,
}

/// `OpMetadata`, the names.
#[derive(Clone, PartialEq, Message)]
pub struct OpMetadata {
    /// Framework op type.
    #[prost(string, tag = "1")]
    pub op_type: String,
    /// Framework op name (jax: the name stack, e.g. `jit(fn)/jvp(grpo_fused_fwd)/pallas_call`).
    #[prost(string, tag = "2")]
    pub op_name: String,
}

/// `ShapeProto`.
#[derive(Clone, PartialEq, Message)]
pub struct Shape {
    /// `PrimitiveType` (e.g. 11 = F32, 16 = BF16, 13 = TUPLE).
    #[prost(int32, tag = "2")]
    pub element_type: i32,
    /// Dimensions of an array.
    #[prost(int64, repeated, tag = "3")]
    pub dimensions: Vec<i64>,
    /// Elements of a tuple.
    #[prost(message, repeated, tag = "4")]
    pub tuple_shapes: Vec<Shape>,
    /// Layout, when the module has layouts (compiled modules do).
    #[prost(message, optional, tag = "5")]
    pub layout: Option<Layout>,
}

/// `LayoutProto`, the fields the suite reads.
#[derive(Clone, PartialEq, Message)]
pub struct Layout {
    /// Minor-to-major dimension order.
    #[prost(int64, repeated, tag = "1")]
    pub minor_to_major: Vec<i64>,
    /// Memory space: 0 is the device's main memory (HBM on TPU); XLA:TPU writes 1 for
    /// VMEM ("alternate memory" of memory-space assignment), others for SMEM and flags.
    #[prost(int64, tag = "8")]
    pub memory_space: i64,
}

/// `LiteralProto`, integer scalars (loop bounds and induction values).
#[derive(Clone, PartialEq, Message)]
pub struct Literal {
    /// S32 values.
    #[prost(int32, repeated, tag = "4")]
    pub s32s: Vec<i32>,
    /// S64 values.
    #[prost(int64, repeated, tag = "5")]
    pub s64s: Vec<i64>,
    /// U32 values.
    #[prost(uint32, repeated, tag = "6")]
    pub u32s: Vec<u32>,
    /// U64 values.
    #[prost(uint64, repeated, tag = "7")]
    pub u64s: Vec<u64>,
}

impl Literal {
    /// The first integer value, if the literal holds integers.
    pub fn first_integer(&self) -> Option<i64> {
        self.s32s
            .first()
            .map(|&x| x as i64)
            .or_else(|| self.s64s.first().copied())
            .or_else(|| self.u32s.first().map(|&x| x as i64))
            .or_else(|| self.u64s.first().map(|&x| x as i64))
    }
}

/// `ConvolutionDimensionNumbers`, the kernel's (right operand's) dimensions.
#[derive(Clone, PartialEq, Message)]
pub struct ConvolutionDimensionNumbers {
    /// The kernel's input-feature dimension (contracted).
    #[prost(int64, tag = "3")]
    pub kernel_input_feature_dimension: i64,
    /// The kernel's output-feature dimension.
    #[prost(int64, tag = "4")]
    pub kernel_output_feature_dimension: i64,
    /// The kernel's spatial dimensions (contracted over the window).
    #[prost(int64, repeated, tag = "6")]
    pub kernel_spatial_dimensions: Vec<i64>,
}

/// `DotDimensionNumbers`.
#[derive(Clone, PartialEq, Message)]
pub struct DotDimensionNumbers {
    /// Contracting dimensions of the left operand.
    #[prost(int64, repeated, tag = "1")]
    pub lhs_contracting_dimensions: Vec<i64>,
    /// Contracting dimensions of the right operand.
    #[prost(int64, repeated, tag = "2")]
    pub rhs_contracting_dimensions: Vec<i64>,
    /// Batch dimensions of the left operand.
    #[prost(int64, repeated, tag = "3")]
    pub lhs_batch_dimensions: Vec<i64>,
    /// Batch dimensions of the right operand.
    #[prost(int64, repeated, tag = "4")]
    pub rhs_batch_dimensions: Vec<i64>,
}

/// `PrecisionConfig`: per operand `DEFAULT` (0), `HIGH` (1), `HIGHEST` (2).
#[derive(Clone, PartialEq, Message)]
pub struct PrecisionConfig {
    /// One per operand.
    #[prost(int32, repeated, tag = "1")]
    pub operand_precision: Vec<i32>,
}

/// `PrimitiveType` numbers the suite names.
pub mod primitive {
    /// PRED.
    pub const PRED: i32 = 1;
    /// S32.
    pub const S32: i32 = 4;
    /// F16.
    pub const F16: i32 = 10;
    /// F32.
    pub const F32: i32 = 11;
    /// TUPLE.
    pub const TUPLE: i32 = 13;
    /// BF16.
    pub const BF16: i32 = 16;
}

/// Bytes of one element of an XLA `PrimitiveType` (0 for tuples, tokens, unknown).
pub fn element_bytes(t: i32) -> u64 {
    match t {
        1 | 2 | 6 => 1,                        // PRED, S8, U8
        3 | 7 | 10 | 16 => 2,                  // S16, U16, F16, BF16
        4 | 8 | 11 => 4,                       // S32, U32, F32
        5 | 9 | 12 | 15 => 8,                  // S64, U64, F64, C64
        18 => 16,                              // C128
        19 | 20 | 23 | 24 | 25 | 28 | 29 => 1, // FP8 kinds
        _ => 0,
    }
}

/// Short name of a `PrimitiveType` (`f32`, `bf16`, `s32`, ...).
pub fn element_name(t: i32) -> &'static str {
    match t {
        1 => "pred",
        2 => "s8",
        3 => "s16",
        4 => "s32",
        5 => "s64",
        6 => "u8",
        7 => "u16",
        8 => "u32",
        9 => "u64",
        10 => "f16",
        11 => "f32",
        12 => "f64",
        13 => "tuple",
        16 => "bf16",
        _ => "other",
    }
}

impl Shape {
    /// Logical bytes (elements × element size; tuples: the sum of their elements).
    pub fn bytes(&self) -> u64 {
        if !self.tuple_shapes.is_empty() {
            return self.tuple_shapes.iter().map(Shape::bytes).sum();
        }
        self.elements() * element_bytes(self.element_type)
    }

    /// Elements of an array shape (1 for a scalar).
    pub fn elements(&self) -> u64 {
        self.dimensions.iter().map(|&d| d.max(0) as u64).product()
    }

    /// The memory space of an array's layout (0 = main memory when there is no layout).
    pub fn memory_space(&self) -> i64 {
        self.layout.as_ref().map_or(0, |l| l.memory_space)
    }

    /// The array leaves of a (possibly nested) tuple, in order; an array is its own leaf.
    pub fn leaves(&self) -> Vec<&Shape> {
        if self.element_type == primitive::TUPLE || !self.tuple_shapes.is_empty() {
            self.tuple_shapes.iter().flat_map(Shape::leaves).collect()
        } else {
            vec![self]
        }
    }
}

/// Decodes an optimized program: `format` "hlo" (a serialized `HloModuleProto`) or
/// "hlo_with_config" (one wrapped with its config). `None` for another format.
pub fn decode(format: &str, bytes: &[u8]) -> Option<Result<HloModule, prost::DecodeError>> {
    match format {
        "hlo" => Some(HloModule::decode(bytes)),
        "hlo_with_config" => {
            Some(ModuleWithConfigProto::decode(bytes).map(|w| w.module.unwrap_or_default()))
        }
        _ => None,
    }
}

/// The collective kinds counted (an async pair `<kind>-start` / `<kind>-done` counts once,
/// by its `-done`, whose shape is the result).
pub const COLLECTIVES: [&str; 6] = [
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
    "ragged-all-to-all",
];

/// One collective kind in a module: how many instructions, and the bytes they produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collective {
    /// e.g. `all-reduce`.
    pub kind: String,
    /// Instructions of this kind (in every computation, loop bodies counted once).
    pub count: u64,
    /// Sum of their result sizes, bytes (per device: SPMD modules are per-device programs).
    pub bytes: u64,
}

/// The collectives of an optimized program (see [`decode`] for the formats), in
/// [`COLLECTIVES`] order (kinds that do not occur are left out). `None` for another format.
pub fn collectives_of(
    format: &str,
    bytes: &[u8],
) -> Option<Result<Vec<Collective>, prost::DecodeError>> {
    decode(format, bytes).map(|m| m.map(|m| count(&m)))
}

/// [`collectives_of`] a serialized `HloModuleProto`.
pub fn collectives(module: &[u8]) -> Result<Vec<Collective>, prost::DecodeError> {
    HloModule::decode(module).map(|m| count(&m))
}

fn count(m: &HloModule) -> Vec<Collective> {
    let mut out: Vec<Collective> = COLLECTIVES
        .iter()
        .map(|k| Collective {
            kind: k.to_string(),
            count: 0,
            bytes: 0,
        })
        .collect();
    for i in m.computations.iter().flat_map(|c| &c.instructions) {
        if i.opcode.ends_with("-start") {
            continue;
        }
        let kind = i.opcode.strip_suffix("-done").unwrap_or(&i.opcode);
        if let Some(c) = out.iter_mut().find(|c| c.kind == kind) {
            c.count += 1;
            c.bytes += i.shape.as_ref().map_or(0, Shape::bytes);
        }
    }
    out.retain(|c| c.count > 0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(opcode: &str, t: i32, dims: &[i64]) -> HloInstruction {
        HloInstruction {
            opcode: opcode.into(),
            shape: Some(Shape {
                element_type: t,
                dimensions: dims.to_vec(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn counts_collectives_and_their_bytes() {
        let m = HloModule {
            computations: vec![HloComputation {
                instructions: vec![
                    inst("add", 11, &[4, 4]),
                    inst("all-reduce", 11, &[512, 1024]), // f32: 2 MiB
                    inst("all-gather-start", 13, &[]),    // counted by its -done
                    inst("all-gather-done", 16, &[8, 128]), // bf16: 2 KiB
                    inst("all-reduce", 16, &[4]),         // bf16: 8 B
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let got = collectives(&m.encode_to_vec()).unwrap();
        assert_eq!(
            got,
            vec![
                Collective {
                    kind: "all-reduce".into(),
                    count: 2,
                    bytes: 512 * 1024 * 4 + 8
                },
                Collective {
                    kind: "all-gather".into(),
                    count: 1,
                    bytes: 8 * 128 * 2
                },
            ]
        );
        assert!(collectives(b"\xff\xff\xff").is_err());
        let wrapped = ModuleWithConfigProto {
            module: Some(m.clone()),
        }
        .encode_to_vec();
        assert_eq!(
            collectives_of("hlo_with_config", &wrapped)
                .unwrap()
                .unwrap(),
            got
        );
        assert!(collectives_of("mlir", &wrapped).is_none());
        assert_eq!(decode("hlo", &m.encode_to_vec()).unwrap().unwrap(), m);
    }

    #[test]
    fn shapes_count_logical_bytes_and_read_memory_spaces() {
        let vmem = Shape {
            element_type: primitive::F32,
            dimensions: vec![8, 128],
            layout: Some(Layout {
                minor_to_major: vec![1, 0],
                memory_space: 1,
            }),
            ..Default::default()
        };
        let hbm = Shape {
            element_type: primitive::BF16,
            dimensions: vec![3, 5],
            ..Default::default()
        };
        let t = Shape {
            element_type: primitive::TUPLE,
            tuple_shapes: vec![vmem.clone(), hbm.clone()],
            ..Default::default()
        };
        assert_eq!((vmem.bytes(), hbm.bytes(), t.bytes()), (4096, 30, 4126));
        assert_eq!((vmem.memory_space(), hbm.memory_space()), (1, 0));
        assert_eq!(t.leaves().len(), 2);
        assert_eq!(
            Literal {
                s32s: vec![7],
                ..Default::default()
            }
            .first_integer(),
            Some(7)
        );
    }
}
