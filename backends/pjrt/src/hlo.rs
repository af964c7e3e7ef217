//! Just enough of a serialized `HloModuleProto` (what `Executable::optimized_program`
//! returns as format "hlo") to list a compiled module's collectives and the bytes they
//! produce. Field numbers are XLA's (`hlo.proto`, `xla_data.proto`); every other field is
//! skipped by the decoder.

use prost::Message;

#[derive(Clone, PartialEq, Message)]
struct ModuleProto {
    #[prost(message, repeated, tag = "3")]
    computations: Vec<ComputationProto>,
}

/// `HloModuleProtoWithConfig` (format "hlo_with_config"): the module is field 1.
#[derive(Clone, PartialEq, Message)]
struct ModuleWithConfigProto {
    #[prost(message, optional, tag = "1")]
    module: Option<ModuleProto>,
}

#[derive(Clone, PartialEq, Message)]
struct ComputationProto {
    #[prost(message, repeated, tag = "2")]
    instructions: Vec<InstructionProto>,
}

#[derive(Clone, PartialEq, Message)]
struct InstructionProto {
    #[prost(string, tag = "2")]
    opcode: String,
    #[prost(message, optional, tag = "3")]
    shape: Option<ShapeProto>,
}

#[derive(Clone, PartialEq, Message)]
struct ShapeProto {
    #[prost(int32, tag = "2")]
    element_type: i32,
    #[prost(int64, repeated, tag = "3")]
    dimensions: Vec<i64>,
    #[prost(message, repeated, tag = "4")]
    tuple_shapes: Vec<ShapeProto>,
}

/// Bytes of one element of an XLA `PrimitiveType` (0 for tuples, tokens, unknown).
fn element_bytes(t: i32) -> u64 {
    match t {
        1 | 2 | 6 => 1,      // PRED, S8, U8
        3 | 7 | 10 | 16 => 2, // S16, U16, F16, BF16
        4 | 8 | 11 => 4,     // S32, U32, F32
        5 | 9 | 12 | 15 => 8, // S64, U64, F64, C64
        18 => 16,            // C128
        _ => 0,
    }
}

fn shape_bytes(s: &ShapeProto) -> u64 {
    if !s.tuple_shapes.is_empty() {
        return s.tuple_shapes.iter().map(shape_bytes).sum();
    }
    s.dimensions.iter().map(|&d| d.max(0) as u64).product::<u64>() * element_bytes(s.element_type)
}

/// The collective kinds counted (an async pair `<kind>-start` / `<kind>-done` counts once,
/// by its `-done`, whose shape is the result).
pub const COLLECTIVES: [&str; 6] = ["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "ragged-all-to-all"];

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

/// The collectives of an optimized program (`format` "hlo": a serialized
/// `HloModuleProto`; "hlo_with_config": one wrapped with its config), in [`COLLECTIVES`]
/// order (kinds that do not occur are left out). `None` for another format.
pub fn collectives_of(format: &str, bytes: &[u8]) -> Option<Result<Vec<Collective>, prost::DecodeError>> {
    match format {
        "hlo" => Some(ModuleProto::decode(bytes).map(|m| count(&m))),
        "hlo_with_config" => Some(ModuleWithConfigProto::decode(bytes).map(|w| count(&w.module.unwrap_or_default()))),
        _ => None,
    }
}

/// [`collectives_of`] a serialized `HloModuleProto`.
pub fn collectives(module: &[u8]) -> Result<Vec<Collective>, prost::DecodeError> {
    ModuleProto::decode(module).map(|m| count(&m))
}

fn count(m: &ModuleProto) -> Vec<Collective> {
    let mut out: Vec<Collective> = COLLECTIVES.iter().map(|k| Collective { kind: k.to_string(), count: 0, bytes: 0 }).collect();
    for i in m.computations.iter().flat_map(|c| &c.instructions) {
        if i.opcode.ends_with("-start") {
            continue;
        }
        let kind = i.opcode.strip_suffix("-done").unwrap_or(&i.opcode);
        if let Some(c) = out.iter_mut().find(|c| c.kind == kind) {
            c.count += 1;
            c.bytes += i.shape.as_ref().map_or(0, shape_bytes);
        }
    }
    out.retain(|c| c.count > 0);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(opcode: &str, t: i32, dims: &[i64]) -> InstructionProto {
        InstructionProto { opcode: opcode.into(), shape: Some(ShapeProto { element_type: t, dimensions: dims.to_vec(), tuple_shapes: vec![] }) }
    }

    #[test]
    fn counts_collectives_and_their_bytes() {
        let m = ModuleProto {
            computations: vec![ComputationProto {
                instructions: vec![
                    inst("add", 11, &[4, 4]),
                    inst("all-reduce", 11, &[512, 1024]),       // f32: 2 MiB
                    inst("all-gather-start", 13, &[]),          // counted by its -done
                    inst("all-gather-done", 16, &[8, 128]),     // bf16: 2 KiB
                    inst("all-reduce", 16, &[4]),               // bf16: 8 B
                ],
            }],
        };
        let got = collectives(&m.encode_to_vec()).unwrap();
        assert_eq!(
            got,
            vec![
                Collective { kind: "all-reduce".into(), count: 2, bytes: 512 * 1024 * 4 + 8 },
                Collective { kind: "all-gather".into(), count: 1, bytes: 8 * 128 * 2 },
            ]
        );
        assert!(collectives(b"\xff\xff\xff").is_err());
        let wrapped = ModuleWithConfigProto { module: Some(m) }.encode_to_vec();
        assert_eq!(collectives_of("hlo_with_config", &wrapped).unwrap().unwrap(), got);
        assert!(collectives_of("mlir", &wrapped).is_none());
    }
}
