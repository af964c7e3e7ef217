//! What the walk reads off an instruction: its result shape, element count and precision.

use grpo_pjrt::hlo::{HloInstruction, Shape};

/// The result shape of an instruction (an empty shape when it has none).
pub(super) fn shape_of(i: &HloInstruction) -> Shape {
    i.shape.clone().unwrap_or_default()
}

/// Elements of an instruction's result, over all its array leaves.
pub(super) fn elements(i: &HloInstruction) -> f64 {
    i.shape.as_ref().map_or(0.0, |s| {
        s.leaves().iter().map(|l| l.elements() as f64).sum()
    })
}

/// The first array leaf of an instruction's result (a library call's result before its
/// workspace).
pub(super) fn first_leaf(i: &HloInstruction) -> Shape {
    shape_of(i)
        .leaves()
        .first()
        .map_or_else(Shape::default, |l| (*l).clone())
}

/// Operand precisions of a `dot` or `convolution` (`DEFAULT` 0, `HIGH` 1, `HIGHEST` 2).
pub(super) fn precision_of(i: &HloInstruction) -> Vec<i32> {
    i.precision_config
        .as_ref()
        .map(|p| p.operand_precision.clone())
        .unwrap_or_default()
}
