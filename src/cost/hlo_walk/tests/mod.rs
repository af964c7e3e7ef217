//! Tests of the walk, by topic; the HLO builders they share.

mod gpu;
mod mosaic;
mod xla;

use super::passes::{F64, FP8_TYPES};
use super::shapes::first_leaf;
use super::{derive, derive_on, dot_passes, gpu_algorithm_passes, gpu_dot_passes, xla_dot_passes};
use crate::cost::{Accelerator, Declared, KernelCost, KernelWork, TensorShape};
use grpo_pjrt::hlo::{
    primitive, DotDimensionNumbers, HloComputation, HloInstruction, HloModule, Layout, Literal,
    PrecisionConfig, Shape,
};

fn arr(t: i32, dims: &[i64]) -> Shape {
    Shape {
        element_type: t,
        dimensions: dims.to_vec(),
        ..Default::default()
    }
}
fn vmem(t: i32, dims: &[i64]) -> Shape {
    Shape {
        layout: Some(Layout {
            minor_to_major: vec![],
            memory_space: 1,
        }),
        ..arr(t, dims)
    }
}
fn tuple(parts: Vec<Shape>) -> Shape {
    Shape {
        element_type: primitive::TUPLE,
        tuple_shapes: parts,
        ..Default::default()
    }
}
fn i(id: i64, op: &str, shape: Shape, operands: &[i64]) -> HloInstruction {
    HloInstruction {
        id,
        name: format!("{op}.{id}"),
        opcode: op.into(),
        shape: Some(shape),
        operand_ids: operands.to_vec(),
        ..Default::default()
    }
}
fn konst(id: i64, v: i32) -> HloInstruction {
    let smem = Shape {
        layout: Some(Layout {
            minor_to_major: vec![],
            memory_space: 6,
        }),
        ..arr(primitive::S32, &[])
    };
    HloInstruction {
        literal: Some(Literal {
            s32s: vec![v],
            ..Default::default()
        }),
        ..i(id, "constant", smem, &[])
    }
}
fn gte(id: i64, src: i64, k: i64, shape: Shape) -> HloInstruction {
    HloInstruction {
        tuple_index: k,
        ..i(id, "get-tuple-element", shape, &[src])
    }
}
/// A `dot` contracting lhs dimension `lc` with rhs dimension `rc` at `precision`.
fn dot(
    id: i64,
    shape: Shape,
    operands: &[i64],
    (lc, rc): (i64, i64),
    precision: i32,
) -> HloInstruction {
    HloInstruction {
        dot_dimension_numbers: Some(DotDimensionNumbers {
            lhs_contracting_dimensions: vec![lc],
            rhs_contracting_dimensions: vec![rc],
            ..Default::default()
        }),
        precision_config: Some(PrecisionConfig {
            operand_precision: vec![precision, precision],
        }),
        ..i(id, "dot", shape, operands)
    }
}
fn param(id: i64, k: i64, shape: Shape) -> HloInstruction {
    HloInstruction {
        parameter_number: k,
        ..i(id, "parameter", shape, &[])
    }
}
fn comp(id: i64, root: i64, instructions: Vec<HloInstruction>) -> HloComputation {
    HloComputation {
        id,
        name: format!("c{id}"),
        root_id: root,
        instructions,
    }
}
