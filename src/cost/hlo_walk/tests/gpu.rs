//! XLA:GPU: cuBLAS and cuDNN calls, Triton gemms, and the GPU's dot weights.

use super::*;

/// XLA's S8 and U8 `PrimitiveType`s: the workspaces of cuBLAS and cuDNN calls.
const S8: i32 = 2;
const U8: i32 = 6;

/// A cuBLAS call's `backend_config` as XLA:GPU writes it (proto3 JSON: int64 lists as
/// strings), contracting lhs dimension `lc` with rhs dimension `rc` over `batch`.
fn gemm_config(lc: i64, rc: i64, batch: &[i64], precision: &str, algorithm: &str) -> Vec<u8> {
    let strings = |d: &[i64]| d.iter().map(i64::to_string).collect::<Vec<_>>();
    serde_json::json!({
        "operation_queue_id": "0",
        "wait_on_operation_queues": [],
        "gemm_backend_config": {
            "alpha_real": 1, "alpha_imag": 0, "beta": 0,
            "dot_dimension_numbers": {
                "lhs_contracting_dimensions": [lc.to_string()],
                "rhs_contracting_dimensions": [rc.to_string()],
                "lhs_batch_dimensions": strings(batch),
                "rhs_batch_dimensions": strings(batch),
            },
            "precision_config": {
                "operand_precision": [precision, precision],
                "algorithm": algorithm,
            },
            "epilogue": "DEFAULT", "lhs_stride": "33554432", "rhs_stride": "622329856",
            "grad_x": false, "grad_y": false, "damax_output": false,
        },
        "force_earliest_schedule": false,
    })
    .to_string()
    .into_bytes()
}

/// A custom call (id 3) to `target` on the entry's two parameters (ids 1, 2).
fn library(target: &str, result: Shape) -> HloInstruction {
    HloInstruction {
        custom_call_target: target.into(),
        ..i(3, "custom-call", result, &[1, 2])
    }
}

/// An entry that applies `call` (id 3) to two parameters of `operands`' shapes and
/// returns the first leaf of its result.
fn call_module(operands: [Shape; 2], call: HloInstruction) -> HloModule {
    let out = first_leaf(&call);
    let [l, r] = operands;
    let entry = comp(
        1,
        4,
        vec![param(1, 0, l), param(2, 1, r), call, gte(4, 3, 0, out)],
    );
    HloModule {
        computations: vec![entry],
        entry_computation_id: 1,
        ..Default::default()
    }
}

/// One cuBLAS `__cublas$gemm` of `lhs` × `rhs` of type `t` into `out` with `config`,
/// its result a tuple of the product and a 32 MiB s8 workspace, as XLA:GPU writes it.
fn gemm_module(t: i32, lhs: &[i64], rhs: &[i64], out: &[i64], config: Vec<u8>) -> HloModule {
    let result = tuple(vec![arr(t, out), arr(S8, &[32 << 20])]);
    call_module(
        [arr(t, lhs), arr(t, rhs)],
        HloInstruction {
            backend_config: config,
            ..library("__cublas$gemm", result)
        },
    )
}

/// The LM head at the seeds' shape: bf16 [8192, 4096] × [4096, 151936].
const LM_HEAD: (f64, f64, f64) = (8192.0, 4096.0, 151936.0);

fn lm_head(t: i32, config: Vec<u8>) -> HloModule {
    gemm_module(t, &[8192, 4096], &[4096, 151936], &[8192, 151936], config)
}

/// [`lm_head`] with a readable config at `precision` and `algorithm`.
fn lm_head_at(t: i32, precision: &str, algorithm: &str) -> HloModule {
    lm_head(t, gemm_config(1, 0, &[], precision, algorithm))
}

#[test]
fn a_cublas_gemm_counts_its_flops_from_its_shapes_and_its_bytes_without_the_workspace() {
    let (m, k, n) = LM_HEAD;
    let d = derive_on(
        &lm_head_at(primitive::BF16, "DEFAULT", "ALG_UNSET"),
        &[],
        Accelerator::Gpu,
    );
    assert_eq!(d.work.matmul_flops, 2.0 * 8192.0 * 4096.0 * 151936.0);
    assert_eq!(d.work.matmul_pass_flops, 2.0 * m * k * n, "bf16 weighs 1");
    // Reads both operands, writes the product; the s8 workspace is scratch.
    assert_eq!(d.work.hbm_bytes, 2.0 * (m * k + k * n + m * n));
    assert!(d.notes.is_empty(), "{:?}", d.notes);
    assert_eq!(
        (d.top[0].op.as_str(), d.top[0].matmul_flops),
        ("custom-call __cublas$gemm", 2.0 * m * k * n)
    );
    // cuBLASLt's targets are read the same way.
    for target in ["__cublas$lt$matmul", "__cublas$lt$matmul$f8"] {
        let mut lt = lm_head_at(primitive::BF16, "DEFAULT", "ALG_UNSET");
        lt.computations[0].instructions[2].custom_call_target = target.into();
        let d = derive_on(&lt, &[], Accelerator::Gpu);
        assert_eq!(d.work.matmul_flops, 2.0 * m * k * n, "{target}");
    }
}

#[test]
fn f32_cublas_gemms_weigh_tf32_or_cuda_core_time_on_gpu() {
    let (m, k, n) = LM_HEAD;
    let flops = 2.0 * m * k * n;
    let weigh = |precision: &str, algorithm: &str, on: Accelerator| {
        let d = derive_on(&lm_head_at(primitive::F32, precision, algorithm), &[], on);
        assert_eq!(d.work.matmul_flops, flops, "{precision} {algorithm}");
        d.work.matmul_pass_flops / flops
    };
    assert_eq!(weigh("HIGHEST", "ALG_UNSET", Accelerator::Gpu), 15.0);
    assert_eq!(weigh("HIGH", "ALG_UNSET", Accelerator::Gpu), 2.0);
    assert_eq!(weigh("DEFAULT", "ALG_UNSET", Accelerator::Gpu), 2.0);
    // An algorithm decides over the precision on GPU.
    assert_eq!(
        weigh("DEFAULT", "ALG_DOT_BF16_BF16_F32_X3", Accelerator::Gpu),
        3.0
    );
    assert_eq!(
        weigh("DEFAULT", "ALG_DOT_TF32_TF32_F32_X3", Accelerator::Gpu),
        6.0
    );
    assert_eq!(
        weigh("HIGHEST", "ALG_DOT_F32_F32_F32", Accelerator::Gpu),
        15.0
    );
    // The same calls on the TPU weights: bf16 passes.
    assert_eq!(weigh("HIGHEST", "ALG_UNSET", Accelerator::Tpu), 6.0);
    assert_eq!(weigh("DEFAULT", "ALG_UNSET", Accelerator::Tpu), 1.0);
}

#[test]
fn a_batched_cublas_gemm_counts_each_batch_and_accepts_numbers() {
    let config = gemm_config(2, 1, &[0], "DEFAULT", "ALG_UNSET");
    let flops_of = |config: Vec<u8>| {
        let m = gemm_module(
            primitive::BF16,
            &[4, 512, 1024],
            &[4, 1024, 256],
            &[4, 512, 256],
            config,
        );
        derive_on(&m, &[], Accelerator::Gpu).work.matmul_flops
    };
    let flops = 2.0 * 4.0 * 512.0 * 256.0 * 1024.0;
    assert_eq!(flops_of(config.clone()), flops);
    // int64 lists written as numbers read the same.
    let numbers = String::from_utf8(config)
        .unwrap()
        .replace(r#"["2"]"#, "[2]")
        .replace(r#"["0"]"#, "[0]");
    assert!(numbers.contains("[2]") && numbers.contains(r#""lhs_batch_dimensions":[0]"#));
    assert_eq!(flops_of(numbers.into_bytes()), flops);
}

#[test]
fn a_cublas_gemm_without_a_readable_config_counts_its_bytes_and_no_flops() {
    let (m, k, n) = LM_HEAD;
    let no_dims = br#"{"gemm_backend_config":{"alpha_real":1}}"#.to_vec();
    let outside_lhs = gemm_config(7, 0, &[], "DEFAULT", "ALG_UNSET");
    for config in [vec![], b"garbage".to_vec(), no_dims, outside_lhs] {
        let shown = String::from_utf8_lossy(&config).to_string();
        let d = derive_on(&lm_head(primitive::BF16, config), &[], Accelerator::Gpu);
        assert_eq!(d.work.matmul_flops, 0.0, "{shown}");
        assert_eq!(d.work.matmul_pass_flops, 0.0, "{shown}");
        assert_eq!(d.work.hbm_bytes, 2.0 * (m * k + k * n + m * n), "{shown}");
        assert!(
            d.notes
                .iter()
                .any(|n| n.contains("custom-call.3") && n.contains("no readable dot dimensions")),
            "{shown}: {:?}",
            d.notes
        );
    }
}

/// A forward convolution NHWC [2, 8, 8, 16] * HWIO [3, 3, 16, 32] → [2, 8, 8, 32], and
/// the cuDNN calls of its two gradients, which carry its dimension numbers.
#[test]
fn cudnn_convolutions_count_the_forward_convolution_they_describe() {
    let dn = grpo_pjrt::hlo::ConvolutionDimensionNumbers {
        kernel_input_feature_dimension: 2,
        kernel_output_feature_dimension: 3,
        kernel_spatial_dimensions: vec![0, 1],
    };
    let f32 = |d: &[i64]| arr(primitive::F32, d);
    let (input, kernel, output) = (
        f32(&[2, 8, 8, 16]),
        f32(&[3, 3, 16, 32]),
        f32(&[2, 8, 8, 32]),
    );
    let with_scratch = |s: &Shape| tuple(vec![s.clone(), arr(U8, &[0])]);
    let calls = [
        ("__cudnn$convForward", [&input, &kernel], &output),
        ("__cudnn$convBackwardInput", [&output, &kernel], &input),
        ("__cudnn$convBackwardFilter", [&input, &output], &kernel),
    ];
    let flops = 2.0 * (2.0 * 8.0 * 8.0 * 32.0) * 16.0 * 9.0;
    for (target, [l, r], result) in calls {
        let call = HloInstruction {
            convolution_dimension_numbers: Some(dn.clone()),
            ..library(target, with_scratch(result))
        };
        let d = derive_on(
            &call_module([l.clone(), r.clone()], call),
            &[],
            Accelerator::Gpu,
        );
        assert_eq!(d.work.matmul_flops, flops, "{target}");
        assert_eq!(
            d.work.matmul_pass_flops,
            2.0 * flops,
            "{target}: f32 on TF32"
        );
        let bytes = (l.bytes() + r.bytes() + result.bytes()) as f64;
        assert_eq!(d.work.hbm_bytes, bytes, "{target}: without the workspace");
    }
    // Another cuDNN call: its bytes, and a note.
    let d = derive_on(
        &call_module(
            [input.clone(), kernel.clone()],
            library("__cudnn$fmhaSoftmax", with_scratch(&output)),
        ),
        &[],
        Accelerator::Gpu,
    );
    assert_eq!(d.work.matmul_flops, 0.0);
    assert_eq!(
        d.work.hbm_bytes,
        (input.bytes() + kernel.bytes() + output.bytes()) as f64
    );
    assert!(
        d.notes.iter().any(|n| n.contains("__cudnn$fmhaSoftmax")),
        "{:?}",
        d.notes
    );
}

/// A Triton gemm: a fusion whose computation multiplies f32 [64, 128] × [128, 32] at
/// `precision` (0 DEFAULT, 1 HIGH, 2 HIGHEST).
fn triton_gemm(precision: i32) -> HloModule {
    let (a, b, c) = (
        arr(primitive::F32, &[64, 128]),
        arr(primitive::F32, &[128, 32]),
        arr(primitive::F32, &[64, 32]),
    );
    let fused = comp(
        10,
        102,
        vec![
            param(100, 0, a.clone()),
            param(101, 1, b.clone()),
            dot(102, c.clone(), &[100, 101], (1, 0), precision),
        ],
    );
    let entry = comp(
        1,
        3,
        vec![
            param(1, 0, a),
            param(2, 1, b),
            HloInstruction {
                called_computation_ids: vec![10],
                fusion_kind: "kCustom".into(),
                ..i(3, "fusion", c, &[1, 2])
            },
        ],
    );
    HloModule {
        computations: vec![fused, entry],
        entry_computation_id: 1,
        ..Default::default()
    }
}

#[test]
fn fused_dots_weigh_gpu_rates_on_gpu_and_bf16_passes_on_tpu() {
    let flops = 2.0 * 64.0 * 32.0 * 128.0;
    let weight = |precision: i32, on: Accelerator| {
        let d = derive_on(&triton_gemm(precision), &[], on);
        assert_eq!(d.work.matmul_flops, flops);
        assert_eq!(
            d.work.hbm_bytes,
            4.0 * (64.0 * 128.0 + 128.0 * 32.0 + 64.0 * 32.0)
        );
        d.work.matmul_pass_flops / flops
    };
    assert_eq!(
        [2, 1, 0].map(|p| weight(p, Accelerator::Gpu)),
        [15.0, 2.0, 2.0]
    );
    // TPU unchanged, and `derive` is the TPU walk.
    assert_eq!(
        [2, 1, 0].map(|p| weight(p, Accelerator::Tpu)),
        [6.0, 3.0, 1.0]
    );
    assert_eq!(
        derive(&triton_gemm(2), &[]),
        derive_on(&triton_gemm(2), &[], Accelerator::Tpu)
    );
}

#[test]
fn gpu_dots_weigh_their_time_relative_to_bf16_tensor_cores() {
    let (f, bf, f8) = (primitive::F32, primitive::BF16, FP8_TYPES[1]);
    assert_eq!(gpu_dot_passes(bf, bf, &[2, 2]), 1.0);
    assert_eq!(gpu_dot_passes(primitive::F16, primitive::F16, &[]), 1.0);
    assert_eq!(gpu_dot_passes(f, f, &[2, 2]), 15.0);
    assert_eq!(gpu_dot_passes(f, bf, &[1, 1]), 2.0);
    assert_eq!(gpu_dot_passes(f, f, &[]), 2.0);
    assert_eq!(gpu_dot_passes(F64, F64, &[]), 15.0);
    assert_eq!(gpu_dot_passes(f8, FP8_TYPES[0], &[]), 0.5);
    assert_eq!(gpu_algorithm_passes("ALG_DOT_BF16_BF16_F32"), Some(1.0));
    assert_eq!(gpu_algorithm_passes("ALG_DOT_BF16_BF16_F32_X9"), Some(9.0));
    assert_eq!(gpu_algorithm_passes("ALG_DOT_TF32_TF32_F32"), Some(2.0));
    assert_eq!(
        gpu_algorithm_passes("ALG_DOT_ANY_F8_ANY_F8_F32_FAST_ACCUM"),
        Some(0.5)
    );
    assert_eq!(gpu_algorithm_passes("ALG_UNSET"), None);
    assert_eq!(gpu_algorithm_passes("ALG_DOT_QQ_F32"), None);
    // The TPU weights are the bf16 passes, unchanged.
    assert_eq!(
        dot_passes(Accelerator::Tpu, f, f, &[2, 2]),
        xla_dot_passes(f, f, &[2, 2])
    );
    assert_eq!(dot_passes(Accelerator::Gpu, f, f, &[2, 2]), 15.0);
}
