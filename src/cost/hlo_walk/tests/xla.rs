//! XLA's own instructions: loop trip counts, operands read as their slices, dot passes on TPU.

use super::*;

/// A loop `for i in 0..7` whose body is a fusion that dynamic-slices a [4096, 1024] bf16
/// matrix into [512, 1024] chunks and multiplies each with a [8, 1024] bf16 operand.
fn chunk_loop(trips: i32, with_init_constant: bool) -> HloModule {
    // Scalars in SMEM (memory space 6), as XLA:TPU places loop counters.
    let s32 = || Shape {
        layout: Some(Layout {
            minor_to_major: vec![],
            memory_space: 6,
        }),
        ..arr(primitive::S32, &[])
    };
    let big = arr(primitive::BF16, &[4096, 1024]);
    let x = arr(primitive::BF16, &[8, 1024]);
    let carry = tuple(vec![s32(), big.clone(), x.clone()]);
    // Fused computation 10: p0 = big, p1 = x, p2 = offset; slice, dot.
    let fused = comp(
        10,
        105,
        vec![
            HloInstruction {
                parameter_number: 0,
                ..i(100, "parameter", big.clone(), &[])
            },
            HloInstruction {
                parameter_number: 1,
                ..i(101, "parameter", x.clone(), &[])
            },
            HloInstruction {
                parameter_number: 2,
                ..i(102, "parameter", s32(), &[])
            },
            konst(103, 0),
            HloInstruction {
                dynamic_slice_sizes: vec![512, 1024],
                ..i(
                    104,
                    "dynamic-slice",
                    arr(primitive::BF16, &[512, 1024]),
                    &[100, 102, 103],
                )
            },
            dot(105, arr(primitive::F32, &[8, 512]), &[101, 104], (1, 1), 0),
        ],
    );
    let body = comp(
        20,
        209,
        vec![
            i(200, "parameter", carry.clone(), &[]),
            gte(201, 200, 0, s32()),
            gte(202, 200, 1, big.clone()),
            gte(203, 200, 2, x.clone()),
            konst(204, 1),
            i(205, "add", s32(), &[201, 204]),
            konst(206, 512),
            i(207, "multiply", s32(), &[201, 206]),
            HloInstruction {
                called_computation_ids: vec![10],
                ..i(
                    208,
                    "fusion",
                    vmem(primitive::F32, &[8, 512]),
                    &[202, 203, 207],
                )
            },
            i(209, "tuple", carry.clone(), &[205, 202, 203]),
        ],
    );
    let cond = comp(
        30,
        303,
        vec![
            i(300, "parameter", carry.clone(), &[]),
            gte(301, 300, 0, s32()),
            konst(302, trips),
            HloInstruction {
                comparison_direction: "LT".into(),
                ..i(
                    303,
                    "compare",
                    Shape {
                        layout: Some(Layout {
                            minor_to_major: vec![],
                            memory_space: 6,
                        }),
                        ..arr(primitive::PRED, &[])
                    },
                    &[301, 302],
                )
            },
        ],
    );
    let init = if with_init_constant {
        konst(402, 0)
    } else {
        i(402, "parameter", s32(), &[])
    };
    let entry = comp(
        40,
        405,
        vec![
            HloInstruction {
                parameter_number: 0,
                ..i(400, "parameter", big.clone(), &[])
            },
            HloInstruction {
                parameter_number: 1,
                ..i(401, "parameter", x.clone(), &[])
            },
            init,
            i(403, "copy", s32(), &[402]),
            i(404, "tuple", carry.clone(), &[403, 400, 401]),
            HloInstruction {
                called_computation_ids: vec![20, 30],
                ..i(405, "while", carry, &[404])
            },
        ],
    );
    HloModule {
        computations: vec![fused, body, cond, entry],
        entry_computation_id: 40,
        ..Default::default()
    }
}

#[test]
fn a_loop_body_counts_once_per_trip_and_a_sliced_operand_as_its_slices() {
    let d = derive(&chunk_loop(7, true), &[]);
    assert_eq!(d.loops.len(), 1);
    assert_eq!(d.loops[0].trips, Some(7));
    // Per trip: 2·8·512·1024 FLOPs; reads a [512, 1024] bf16 slice (1 MiB) and the
    // [8, 1024] operand (16 KiB); the [8, 512] f32 result is in VMEM (no HBM bytes).
    let per = 2.0 * 8.0 * 512.0 * 1024.0;
    assert_eq!(d.work.matmul_flops, 7.0 * per);
    assert_eq!(d.work.matmul_pass_flops, 7.0 * per);
    assert_eq!(
        d.work.hbm_bytes,
        7.0 * (512.0 * 1024.0 * 2.0 + 8.0 * 1024.0 * 2.0)
    );
    // The body's scalar add and multiply are scalar work counted as flops (1 each per
    // trip) and the condition's compare once per test (8 times).
    assert_eq!(d.work.other_flops, 7.0 * 2.0 + 8.0);
    assert!(d.notes.is_empty(), "{:?}", d.notes);
    // The same loop with XLA's own trip count in its backend config (XLA:GPU's form,
    // whose condition the pattern cannot read): counted 7 times.
    let mut annotated = chunk_loop(7, false);
    for c in &mut annotated.computations {
        for i in c.instructions.iter_mut().filter(|i| i.opcode == "while") {
            i.backend_config = br#"{"known_trip_count":{"n":"7"}}"#.to_vec();
        }
    }
    let d = derive(&annotated, &[]);
    assert_eq!(
        (d.loops[0].trips, d.work.matmul_flops),
        (Some(7), 7.0 * per)
    );
    // A loop whose start is not a constant is counted once and named.
    let d = derive(&chunk_loop(7, false), &[]);
    assert_eq!(d.loops[0].trips, None);
    assert_eq!(d.work.matmul_flops, per);
    assert!(
        d.notes
            .iter()
            .any(|n| n.contains("trip count not derivable")),
        "{:?}",
        d.notes
    );
}

#[test]
fn an_operand_sliced_inside_a_nested_fusion_is_read_as_its_slice() {
    // XLA:TPU nests the dynamic-slice of a loop's chunk in a kLoop fusion inside the
    // matmul's kOutput fusion: the LM head must still count as its chunk, not whole.
    let mut m = chunk_loop(7, true);
    let big = arr(primitive::BF16, &[4096, 1024]);
    let s32 = Shape {
        layout: Some(Layout {
            minor_to_major: vec![],
            memory_space: 6,
        }),
        ..arr(primitive::S32, &[])
    };
    let inner = comp(
        11,
        113,
        vec![
            HloInstruction {
                parameter_number: 0,
                ..i(110, "parameter", big.clone(), &[])
            },
            HloInstruction {
                parameter_number: 1,
                ..i(111, "parameter", s32.clone(), &[])
            },
            konst(112, 0),
            i(
                113,
                "dynamic-slice",
                arr(primitive::BF16, &[512, 1024]),
                &[110, 111, 112],
            ),
        ],
    );
    let fused = &mut m.computations[0];
    fused.instructions[4] = HloInstruction {
        called_computation_ids: vec![11],
        ..i(
            104,
            "fusion",
            arr(primitive::BF16, &[512, 1024]),
            &[100, 102],
        )
    };
    fused.instructions.remove(3);
    m.computations.insert(0, inner);
    let d = derive(&m, &[]);
    assert_eq!(
        d.work.hbm_bytes,
        7.0 * (512.0 * 1024.0 * 2.0 + 8.0 * 1024.0 * 2.0),
        "{:?}",
        d.top
    );
    assert_eq!(d.work.matmul_flops, 7.0 * 2.0 * 8.0 * 512.0 * 1024.0);
}

#[test]
fn f32_dots_weigh_their_bf16_passes() {
    let f = primitive::F32;
    assert_eq!(xla_dot_passes(f, f, &[2, 2]), 6.0);
    assert_eq!(xla_dot_passes(f, f, &[1, 1]), 3.0);
    assert_eq!(xla_dot_passes(f, f, &[0, 0]), 1.0);
    assert_eq!(
        xla_dot_passes(primitive::BF16, primitive::BF16, &[2, 2]),
        1.0
    );
}
