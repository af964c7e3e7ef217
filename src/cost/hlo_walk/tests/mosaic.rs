//! Mosaic kernels: counted from the exporter's derivation, matched by shapes and name.

use super::*;

fn kernel(name: &str, bytes: f64, declared_bytes: f64) -> KernelCost {
    KernelCost {
        name: name.into(),
        grid: vec![4],
        steps: 4,
        operands: vec![TensorShape {
            shape: vec![64, 128],
            dtype: "f32".into(),
        }],
        results: vec![TensorShape {
            shape: vec![64, 128],
            dtype: "f32".into(),
        }],
        derived: KernelWork {
            other_flops: 8192.0,
            hbm_bytes: bytes,
            bytes_read: bytes / 2.0,
            bytes_written: bytes / 2.0,
            ..Default::default()
        },
        declared: Some(Declared {
            flops: 8192.0,
            transcendentals: 0.0,
            bytes_accessed: declared_bytes,
        }),
        notes: vec![],
        blocks: serde_json::json!([
            {"operand": "in0", "hlo_operand": 0, "bytes": bytes / 2.0},
            {"operand": "out0", "hlo_result": 0, "bytes": bytes / 2.0},
        ]),
    }
}

fn kernel_module(op_name: &str) -> HloModule {
    kernel_module_with(op_name, arr(primitive::F32, &[64, 128]))
}

fn kernel_module_with(op_name: &str, input: Shape) -> HloModule {
    let a = arr(primitive::F32, &[64, 128]);
    let entry = comp(
        1,
        3,
        vec![
            HloInstruction {
                parameter_number: 0,
                ..i(1, "parameter", input, &[])
            },
            HloInstruction {
                custom_call_target: "tpu_custom_call".into(),
                metadata: Some(grpo_pjrt::hlo::OpMetadata {
                    op_name: op_name.into(),
                    ..Default::default()
                }),
                ..i(2, "custom-call", a.clone(), &[1])
            },
            i(3, "negate", a, &[2]),
        ],
    );
    HloModule {
        computations: vec![entry],
        entry_computation_id: 1,
        ..Default::default()
    }
}

#[test]
fn mosaic_kernels_count_their_derived_cost_and_a_half_declaration_is_named() {
    let ks = [
        kernel("other", 1.0, 1.0),
        kernel("grpo_logp_fwd", 65536.0, 65536.0),
    ];
    let d = derive(
        &kernel_module("jit(fn)/jvp(grpo_logp_fwd)/pallas_call"),
        &ks,
    );
    // The kernel's 65536 derived bytes, plus the negate's 2 × 32 KiB.
    assert_eq!(d.work.hbm_bytes, 65536.0 + 2.0 * 32768.0);
    assert_eq!(d.kernel_work.hbm_bytes, 65536.0);
    assert_eq!(d.kernels.len(), 1);
    assert_eq!(
        (d.kernels[0].name.as_str(), d.kernels[0].invocations),
        ("grpo_logp_fwd", 1.0)
    );
    assert_eq!(d.grid_steps, 4.0, "the kernel's grid steps");
    assert!(d.mismatches().is_empty());
    let half = [kernel("grpo_logp_fwd", 65536.0, 32768.0)];
    let d = derive(
        &kernel_module("jit(fn)/jvp(grpo_logp_fwd)/pallas_call"),
        &half,
    );
    let m = d.mismatches();
    assert_eq!(m.len(), 1);
    assert!(
        m[0].contains("bytes_accessed") && m[0].contains("-50%"),
        "{}",
        m[0]
    );
    // An input XLA placed in VMEM: the kernel's copies of it are not HBM traffic (its
    // declaration is still checked against everything the kernel copies).
    let d = derive(
        &kernel_module_with(
            "jit(fn)/jvp(grpo_logp_fwd)/pallas_call",
            vmem(primitive::F32, &[64, 128]),
        ),
        &ks,
    );
    assert_eq!(d.kernel_work.hbm_bytes, 32768.0);
    assert!(d.mismatches().is_empty());
    // A kernel the exporter did not derive is named, never silently free.
    let d = derive(&kernel_module("jit(fn)/x/pallas_call"), &[]);
    assert!(
        d.notes.iter().any(|n| n.contains("matches no kernel")),
        "{:?}",
        d.notes
    );
}
