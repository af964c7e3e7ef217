//! Tests against the real XLA CPU PJRT plugin of the pinned wheel
//! (`.venv/.../xla_cpu_pjrt.so`, or `GRPO_PJRT_PLUGIN`). A missing plugin or
//! venv fails the tests with a clear message: `scripts/setup.sh` always
//! creates them.

use std::path::PathBuf;
use std::process::Command;

use grpo_pjrt::{
    Bf16, Buffer, Client, ClientOptions, CompileOptions, DeviceAssignment, ElementType, Error,
    ErrorCode, Plugin, Program, Topology, F16, HEADER_API_VERSION,
};

const ADD_F32: &str = r#"
module @add_f32 {
  func.func public @main(%a: tensor<3xf32>, %b: tensor<3xf32>) -> tensor<3xf32> {
    %0 = stablehlo.add %a, %b : tensor<3xf32>
    return %0 : tensor<3xf32>
  }
}
"#;

fn plugin() -> Plugin {
    Plugin::load_default().unwrap_or_else(|e| panic!("{e}"))
}

fn client_with(devices: i64) -> Client {
    Client::new(&plugin(), &ClientOptions::cpu_devices(devices)).expect("create CPU client")
}

fn client() -> Client {
    client_with(1)
}

fn upload_f32(c: &Client, data: &[f32], dims: &[i64]) -> Buffer {
    let dev = &c.addressable_devices().unwrap()[0];
    c.buffer_from_host(data, dims, dev).unwrap()
}

#[test]
fn plugin_reports_header_api_version() {
    let p = plugin();
    assert_eq!(
        HEADER_API_VERSION,
        grpo_pjrt::ApiVersion {
            major: 0,
            minor: 81
        }
    );
    assert_eq!(p.api_version().major, HEADER_API_VERSION.major);
    if std::env::var_os(grpo_pjrt::PLUGIN_ENV).is_none() {
        // The pinned wheel: same version as the header the bindings came from.
        assert_eq!(p.api_version(), HEADER_API_VERSION);
        assert_eq!(p.api_struct_size(), grpo_pjrt::header_api_struct_size());
    }
    // Loading the same path again returns the already-initialized plugin.
    let again = Plugin::load(p.path()).unwrap();
    assert_eq!(again.api_version(), p.api_version());
    let attrs = p.attributes().unwrap();
    assert!(
        attrs.iter().any(|a| a.name == "stablehlo_current_version"),
        "{attrs:?}"
    );
}

#[test]
fn missing_plugin_path_is_a_clear_error() {
    let err = Plugin::load("/nonexistent/dir/libnot_a_plugin.so").unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::PluginNotFound { .. }), "{err:?}");
    assert!(msg.contains("/nonexistent/dir/libnot_a_plugin.so"), "{msg}");
    assert!(msg.contains("scripts/setup.sh"), "{msg}");
    assert!(msg.contains("GRPO_PJRT_PLUGIN"), "{msg}");
}

#[test]
fn non_plugin_library_is_a_load_error() {
    // A real shared library without GetPjrtApi.
    let libc = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.is_file());
    let Some(lib) = libc else { return };
    let err = Plugin::load(&lib).unwrap_err();
    assert!(matches!(err, Error::PluginLoad { .. }), "{err:?}");
    assert!(err.to_string().contains("GetPjrtApi"), "{err}");
}

#[test]
fn client_devices_and_platform() {
    let c = Client::new(&plugin(), &ClientOptions::default()).unwrap();
    assert_eq!(c.platform_name().unwrap(), "cpu");
    let devices = c.devices().unwrap();
    assert_eq!(
        devices.len(),
        4,
        "the CPU plugin exposes 4 devices by default"
    );
    assert_eq!(c.addressable_devices().unwrap().len(), 4);
    for (i, d) in devices.iter().enumerate() {
        let desc = d.description().unwrap();
        assert_eq!(desc.id, i as i32);
        assert_eq!(desc.kind, "cpu");
        assert!(!desc.debug_string.is_empty());
        assert!(d.is_addressable().unwrap());
        assert_eq!(c.lookup_device(desc.id).unwrap(), *d);
    }
    let two = client_with(2);
    assert_eq!(two.devices().unwrap().len(), 2);
}

#[test]
fn add_f32_from_mlir_text() {
    let c = client();
    let exe = c
        .compile(&Program::mlir_text(ADD_F32), &CompileOptions::default())
        .unwrap();
    assert_eq!(exe.num_outputs(), 1);
    let a = upload_f32(&c, &[1.0, 2.0, 3.0], &[3]);
    let b = upload_f32(&c, &[10.0, 20.0, 30.0], &[3]);
    let out = exe.execute(&[vec![&a, &b]]).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].len(), 1);
    let y = &out[0][0];
    assert_eq!(y.element_type().unwrap(), ElementType::F32);
    assert_eq!(y.dims().unwrap(), vec![3]);
    assert_eq!(y.to_host::<f32>().unwrap(), vec![11.0, 22.0, 33.0]);
    // Run it again with the same inputs (inputs are not donated).
    let out2 = exe.execute(&[[&a, &b]]).unwrap();
    assert_eq!(out2[0][0].to_host::<f32>().unwrap(), vec![11.0, 22.0, 33.0]);
}

/// The XLA:CPU settings the suite passes as compile-option overrides (its
/// `GRPO_XLA_CPU_OPT_LEVEL` and `GRPO_XLA_CPU_FUSION_EMITTERS`) are debug options this
/// plugin knows: a module compiles and computes with them, while a name it does not know
/// is refused, so a misspelt override cannot be silently ignored.
#[test]
fn xla_cpu_option_overrides_are_applied_by_name() {
    use grpo_pjrt::proto::OptionOverrideValue::{BoolField, IntField};
    let c = client();
    let with = |name: &str, value| {
        let mut o = CompileOptions::default();
        o.option_overrides.push((name.to_string(), value));
        c.compile(&Program::mlir_text(ADD_F32), &o)
    };
    for (name, value) in [
        ("xla_backend_optimization_level", IntField(0)),
        ("xla_cpu_use_fusion_emitters", BoolField(false)),
        ("xla_cpu_use_fusion_emitters", BoolField(true)),
    ] {
        let exe = with(name, value).unwrap_or_else(|e| panic!("{name}: {e}"));
        let a = upload_f32(&c, &[1.0, 2.0, 3.0], &[3]);
        let b = upload_f32(&c, &[10.0, 20.0, 30.0], &[3]);
        let out = exe.execute(&[vec![&a, &b]]).unwrap();
        assert_eq!(
            out[0][0].to_host::<f32>().unwrap(),
            vec![11.0, 22.0, 33.0],
            "{name}"
        );
    }
    let e = with("xla_cpu_use_fusion_emitterz", BoolField(false))
        .err()
        .expect("an unknown override name is refused");
    assert!(e.to_string().contains("xla_cpu_use_fusion_emitterz"), "{e}");
}

#[test]
fn execute_async_then_wait_for_outputs() {
    let c = client();
    let exe = c
        .compile(&Program::mlir_text(ADD_F32), &CompileOptions::default())
        .unwrap();
    let a = upload_f32(&c, &[1.0, 2.0, 3.0], &[3]);
    let b = upload_f32(&c, &[0.5, 0.5, 0.5], &[3]);
    let run = exe.execute_async(&[vec![&a, &b]]).unwrap();
    assert_eq!(run.device_events.len(), 1);
    run.outputs[0][0].block_until_ready().unwrap();
    assert!(run.outputs[0][0].ready_event().unwrap().is_ready().unwrap());
    for e in &run.device_events {
        e.wait().unwrap();
        assert!(e.is_ready().unwrap());
        e.error().unwrap();
    }
    let outs = run.wait().unwrap();
    assert_eq!(outs[0][0].to_host::<f32>().unwrap(), vec![1.5, 2.5, 3.5]);
}

#[test]
fn executable_metadata() {
    let c = client();
    let exe = c
        .compile(&Program::mlir_text(ADD_F32), &CompileOptions::default())
        .unwrap();
    let e = exe.executable();
    assert_eq!(e.num_outputs().unwrap(), 1);
    assert_eq!(e.num_replicas().unwrap(), 1);
    assert_eq!(e.num_partitions().unwrap(), 1);
    assert_eq!(e.output_element_types().unwrap(), vec![ElementType::F32]);
    assert_eq!(e.output_dims().unwrap(), vec![vec![3]]);
    assert!(!e.name().unwrap().is_empty());
    assert_eq!(exe.addressable_devices().unwrap().len(), 1);
}

#[test]
fn compiled_memory_stats_are_reported() {
    let c = client();
    let exe = c
        .compile(&Program::mlir_text(ADD_F32), &CompileOptions::default())
        .unwrap();
    let stats = exe
        .executable()
        .compiled_memory_stats()
        .unwrap()
        .expect("CPU plugin implements compiled memory stats");
    // Two f32[3] arguments and one f32[3] output.
    assert_eq!(stats.argument_size_in_bytes, 24, "{stats:?}");
    assert_eq!(stats.output_size_in_bytes, 12, "{stats:?}");
    assert!(stats.temp_size_in_bytes >= 0);
    assert!(
        stats.peak_memory_in_bytes.is_some(),
        "API 0.81 header has peak_memory_in_bytes"
    );
}

#[test]
fn cost_analysis_is_optional() {
    let c = client();
    let exe = c
        .compile(&Program::mlir_text(ADD_F32), &CompileOptions::default())
        .unwrap();
    match exe.executable().cost_analysis().unwrap() {
        Some(cost) => {
            eprintln!("cost analysis: {:?}", cost.properties);
            if let Some(flops) = cost.get_f64("flops") {
                assert_eq!(flops, 3.0, "three f32 adds");
            }
        }
        None => eprintln!("plugin does not implement cost analysis"),
    }
}

#[test]
fn device_memory_stats_are_optional() {
    let c = client();
    let d = &c.addressable_devices().unwrap()[0];
    // Unimplemented on CPU: must be Ok(None), not an error or a panic.
    let stats = d.memory_stats().unwrap();
    assert!(
        stats.is_none(),
        "CPU plugin unexpectedly implements device memory stats: {stats:?}"
    );
}

#[test]
fn bad_mlir_gives_the_plugin_parse_message() {
    let c = client();
    let err = c
        .compile(
            &Program::mlir_text("module { this is not mlir }"),
            &CompileOptions::default(),
        )
        .unwrap_err();
    let msg = err.to_string();
    match &err {
        Error::Pjrt {
            function,
            code,
            message,
        } => {
            assert_eq!(*function, "PJRT_Client_Compile");
            // The CPU plugin reports MLIR parse failures as UNKNOWN.
            assert_ne!(*code, ErrorCode::Unimplemented, "{message}");
            assert!(
                message.contains("Failed to parse"),
                "plugin message should be the parse error: {message}"
            );
            assert!(message.contains("custom op 'this' is unknown"), "{message}");
        }
        other => panic!("expected a plugin error, got {other:?}"),
    }
    assert!(msg.contains("PJRT_Client_Compile"), "{msg}");
    assert!(err.code().is_some() && !err.is_unimplemented());
}

#[test]
fn wrong_argument_count_is_an_error_not_a_crash() {
    let c = client();
    let exe = c
        .compile(&Program::mlir_text(ADD_F32), &CompileOptions::default())
        .unwrap();
    let a = upload_f32(&c, &[1.0, 2.0, 3.0], &[3]);
    let err = exe.execute(&[vec![&a]]).unwrap_err();
    assert!(matches!(err, Error::Pjrt { .. }), "{err:?}");
    eprintln!("wrong argument count: {err}");
    // Too many device lists for a single-device executable.
    let b = upload_f32(&c, &[1.0, 2.0, 3.0], &[3]);
    let err = exe.execute(&[vec![&a, &b], vec![&a, &b]]).unwrap_err();
    eprintln!("wrong device count: {err}");
    // Ragged lists are rejected before calling the plugin.
    let err = exe.execute(&[vec![&a, &b], vec![&a]]).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let empty: &[Vec<&Buffer>] = &[];
    assert!(matches!(
        exe.execute(empty).unwrap_err(),
        Error::InvalidArgument(_)
    ));
}

#[test]
fn wrong_argument_shape_is_an_error() {
    let c = client();
    let exe = c
        .compile(&Program::mlir_text(ADD_F32), &CompileOptions::default())
        .unwrap();
    let a = upload_f32(&c, &[1.0, 2.0, 3.0, 4.0], &[4]);
    let b = upload_f32(&c, &[1.0, 2.0, 3.0], &[3]);
    let err = exe.execute(&[vec![&a, &b]]).unwrap_err();
    eprintln!("wrong argument shape: {err}");
}

#[test]
fn host_buffer_length_is_checked() {
    let c = client();
    let dev = &c.addressable_devices().unwrap()[0];
    let err = c.buffer_from_host(&[1.0f32, 2.0], &[3], dev).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    let buf = c.buffer_from_host(&[1i32, 2, 3], &[3], dev).unwrap();
    let err = buf.to_host::<f32>().unwrap_err();
    assert!(err.to_string().contains("S32"), "{err}");
}

#[test]
fn multi_device_execute_keeps_outputs_per_device() {
    let c = client_with(2);
    let devices = c.addressable_devices().unwrap();
    assert_eq!(devices.len(), 2);
    let exe = c
        .compile(&Program::mlir_text(ADD_F32), &CompileOptions::replicated(2))
        .unwrap();
    let exe_devices = exe.addressable_devices().unwrap();
    assert_eq!(exe_devices.len(), 2);
    assert_eq!(exe.executable().num_replicas().unwrap(), 2);
    let mut args = Vec::new();
    for (i, d) in exe_devices.iter().enumerate() {
        let k = (i + 1) as f32;
        let a = c.buffer_from_host(&[k, k, k], &[3], d).unwrap();
        let b = c
            .buffer_from_host(&[100.0 * k, 200.0 * k, 300.0 * k], &[3], d)
            .unwrap();
        args.push((a, b));
    }
    let lists: Vec<Vec<&Buffer>> = args.iter().map(|(a, b)| vec![a, b]).collect();
    let out = exe.execute(&lists).unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(
        out[0][0].to_host::<f32>().unwrap(),
        vec![101.0, 201.0, 301.0]
    );
    assert_eq!(
        out[1][0].to_host::<f32>().unwrap(),
        vec![202.0, 402.0, 602.0]
    );
    for (i, row) in out.iter().enumerate() {
        assert_eq!(
            row[0].device().unwrap(),
            exe_devices[i],
            "output {i} lives on its own device"
        );
    }
}

#[test]
fn explicit_device_assignment() {
    let c = client_with(4);
    let da = c.default_device_assignment(2, 1).unwrap();
    assert_eq!(da.num_replicas(), 2);
    // Run two replicas on devices 3 and 1 (in that order).
    let opts = CompileOptions {
        num_replicas: 2,
        device_assignment: Some(DeviceAssignment::replicas(&[3, 1]).unwrap()),
        ..Default::default()
    };
    let exe = c.compile(&Program::mlir_text(ADD_F32), &opts).unwrap();
    let ids: Vec<i32> = exe
        .addressable_devices()
        .unwrap()
        .iter()
        .map(|d| d.id().unwrap())
        .collect();
    assert_eq!(ids, vec![3, 1]);
    let devs = exe.addressable_devices().unwrap();
    let bufs: Vec<(Buffer, Buffer)> = devs
        .iter()
        .map(|d| {
            let id = d.id().unwrap() as f32;
            (
                c.buffer_from_host(&[id; 3], &[3], d).unwrap(),
                c.buffer_from_host(&[1.0f32; 3], &[3], d).unwrap(),
            )
        })
        .collect();
    let lists: Vec<[&Buffer; 2]> = bufs.iter().map(|(a, b)| [a, b]).collect();
    let out = exe.execute(&lists).unwrap();
    assert_eq!(out[0][0].to_host::<f32>().unwrap(), vec![4.0; 3]);
    assert_eq!(out[1][0].to_host::<f32>().unwrap(), vec![2.0; 3]);
    assert_eq!(out[0][0].device().unwrap().id().unwrap(), 3);
}

#[test]
fn bf16_f16_i32_pred_round_trips() {
    let c = client();
    let dev = &c.addressable_devices().unwrap()[0];

    let bf: Vec<Bf16> = [1.0f32, -2.5, 3.140625, 0.0]
        .iter()
        .map(|&x| Bf16::from_f32(x))
        .collect();
    let b = c.buffer_from_host(&bf, &[2, 2], dev).unwrap();
    assert_eq!(b.element_type().unwrap(), ElementType::Bf16);
    assert_eq!(b.dims().unwrap(), vec![2, 2]);
    let back: Vec<f32> = b
        .to_host::<Bf16>()
        .unwrap()
        .iter()
        .map(|x| x.to_f32())
        .collect();
    assert_eq!(back, vec![1.0, -2.5, 3.140625, 0.0]);

    let h: Vec<F16> = [0.5f32, -1.0, 65504.0]
        .iter()
        .map(|&x| F16::from_f32(x))
        .collect();
    let b = c.buffer_from_host(&h, &[3], dev).unwrap();
    assert_eq!(b.element_type().unwrap(), ElementType::F16);
    let back: Vec<f32> = b
        .to_host::<F16>()
        .unwrap()
        .iter()
        .map(|x| x.to_f32())
        .collect();
    assert_eq!(back, vec![0.5, -1.0, 65504.0]);

    let ints = [i32::MIN, -1, 0, 7, i32::MAX, 42];
    let b = c.buffer_from_host(&ints, &[2, 3], dev).unwrap();
    assert_eq!(b.element_type().unwrap(), ElementType::S32);
    assert_eq!(b.dims().unwrap(), vec![2, 3]);
    assert_eq!(b.to_host::<i32>().unwrap(), ints.to_vec());

    let preds = [true, false, false, true, true];
    let b = c.buffer_from_host(&preds, &[5], dev).unwrap();
    assert_eq!(b.element_type().unwrap(), ElementType::Pred);
    assert_eq!(b.to_host::<bool>().unwrap(), preds.to_vec());
    assert_eq!(b.to_host_bytes().unwrap(), vec![1, 0, 0, 1, 1]);

    // Raw bytes path, scalar shape.
    let b = c
        .buffer_from_bytes(ElementType::F32, &2.5f32.to_le_bytes(), &[], dev)
        .unwrap();
    assert_eq!(b.dims().unwrap(), Vec::<i64>::new());
    assert_eq!(b.to_host::<f32>().unwrap(), vec![2.5]);
}

#[test]
fn bf16_i32_pred_programs_compute() {
    let c = client();
    let dev = &c.addressable_devices().unwrap()[0];
    let prog = r#"
module @mixed {
  func.func public @main(%x: tensor<4xbf16>, %y: tensor<4xbf16>, %i: tensor<4xi32>, %p: tensor<4xi1>)
      -> (tensor<4xbf16>, tensor<4xi32>, tensor<4xi1>) {
    %0 = stablehlo.multiply %x, %y : tensor<4xbf16>
    %1 = stablehlo.add %i, %i : tensor<4xi32>
    %2 = stablehlo.not %p : tensor<4xi1>
    return %0, %1, %2 : tensor<4xbf16>, tensor<4xi32>, tensor<4xi1>
  }
}
"#;
    let exe = c
        .compile(&Program::mlir_text(prog), &CompileOptions::default())
        .unwrap();
    assert_eq!(exe.num_outputs(), 3);
    let x: Vec<Bf16> = [1.0f32, 2.0, -3.0, 0.5]
        .iter()
        .map(|&v| Bf16::from_f32(v))
        .collect();
    let y: Vec<Bf16> = [4.0f32, 0.25, 2.0, 8.0]
        .iter()
        .map(|&v| Bf16::from_f32(v))
        .collect();
    let bx = c.buffer_from_host(&x, &[4], dev).unwrap();
    let by = c.buffer_from_host(&y, &[4], dev).unwrap();
    let bi = c.buffer_from_host(&[1i32, -2, 3, 100], &[4], dev).unwrap();
    let bp = c
        .buffer_from_host(&[true, false, true, false], &[4], dev)
        .unwrap();
    let out = exe.execute(&[vec![&bx, &by, &bi, &bp]]).unwrap();
    let prod: Vec<f32> = out[0][0]
        .to_host::<Bf16>()
        .unwrap()
        .iter()
        .map(|v| v.to_f32())
        .collect();
    assert_eq!(prod, vec![4.0, 0.5, -6.0, 4.0]);
    assert_eq!(out[0][1].to_host::<i32>().unwrap(), vec![2, -4, 6, 200]);
    assert_eq!(
        out[0][2].to_host::<bool>().unwrap(),
        vec![false, true, false, true]
    );
}

/// Exports `jnp.add` for two f32[3] with jax and returns the StableHLO
/// bytecode (`exported.mlir_module_serialized`).
fn jax_add_bytecode() -> Vec<u8> {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    assert!(
        python.is_file(),
        "project venv python not found at {}: run scripts/setup.sh",
        python.display()
    );
    let script = r#"
import sys, jax, jax.numpy as jnp
jax.config.update("jax_platforms", "cpu")
spec = jax.ShapeDtypeStruct((3,), jnp.float32)
exp = jax.export.export(jax.jit(lambda a, b: a + b))(spec, spec)
sys.stdout.buffer.write(exp.mlir_module_serialized)
"#;
    let out = Command::new(&python)
        .arg("-c")
        .arg(script)
        .output()
        .expect("run venv python");
    assert!(
        out.status.success(),
        "jax export failed (run scripts/setup.sh?): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout.starts_with(b"ML\xefR"),
        "expected MLIR bytecode magic"
    );
    out.stdout
}

#[test]
fn add_f32_from_jax_bytecode() {
    let bytecode = jax_add_bytecode();
    let c = client();
    let exe = c
        .compile(
            &Program::mlir_bytecode(bytecode),
            &CompileOptions::default(),
        )
        .unwrap();
    let a = upload_f32(&c, &[1.0, 2.0, 3.0], &[3]);
    let b = upload_f32(&c, &[10.0, 20.0, 30.0], &[3]);
    let out = exe.execute(&[vec![&a, &b]]).unwrap();
    assert_eq!(out[0][0].to_host::<f32>().unwrap(), vec![11.0, 22.0, 33.0]);
}

#[test]
fn client_topology_is_readable() {
    let c = client_with(2);
    let topo = c.topology().unwrap();
    assert_eq!(topo.platform_name().unwrap(), "cpu");
    let descs = topo.device_descriptions().unwrap();
    assert_eq!(descs.len(), 2);
    assert!(descs.iter().all(|d| d.kind == "cpu"));
}

#[test]
fn deviceless_compile_returns_executable_or_plugin_error() {
    let p = plugin();
    match Topology::create(&p, "cpu", &[]) {
        Ok(topo) => match topo.compile(&Program::mlir_text(ADD_F32), &CompileOptions::default()) {
            Ok(exe) => {
                let stats = exe.compiled_memory_stats().unwrap();
                eprintln!("deviceless compile OK; memory stats {stats:?}");
                if let Some(s) = stats {
                    assert_eq!(s.argument_size_in_bytes, 24);
                }
            }
            Err(e) => eprintln!("PJRT_Compile not supported by this plugin: {e}"),
        },
        Err(e) => {
            eprintln!("PJRT_TopologyDescription_Create not supported by this plugin: {e}");
            assert!(
                matches!(e, Error::Pjrt { .. } | Error::MissingFunction { .. }),
                "{e:?}"
            );
        }
    }
    // Compiling against the client's topology without a client.
    let c = client();
    let topo = c.topology().unwrap();
    match topo.compile(&Program::mlir_text(ADD_F32), &CompileOptions::default()) {
        Ok(exe) => eprintln!(
            "client-topology PJRT_Compile OK: {:?}",
            exe.compiled_memory_stats()
        ),
        Err(e) => eprintln!("client-topology PJRT_Compile: {e}"),
    }
}

#[test]
fn objects_outliving_the_client_handle_stay_valid() {
    let (exe, a, b) = {
        let c = client();
        let exe = c
            .compile(&Program::mlir_text(ADD_F32), &CompileOptions::default())
            .unwrap();
        let a = upload_f32(&c, &[1.0, 1.0, 1.0], &[3]);
        let b = upload_f32(&c, &[2.0, 2.0, 2.0], &[3]);
        (exe, a, b)
    };
    let out = exe.execute(&[vec![&a, &b]]).unwrap();
    assert_eq!(out[0][0].to_host::<f32>().unwrap(), vec![3.0; 3]);
}

#[test]
fn plugin_is_shared_across_threads_with_one_client_per_thread() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Plugin>();
    let p = plugin();
    let handles: Vec<_> = (0..2)
        .map(|t| {
            let p = p.clone();
            std::thread::spawn(move || {
                let c = Client::new(&p, &ClientOptions::cpu_devices(1)).unwrap();
                let exe = c
                    .compile(&Program::mlir_text(ADD_F32), &CompileOptions::default())
                    .unwrap();
                let k = t as f32;
                let a = upload_f32(&c, &[k, k, k], &[3]);
                let b = upload_f32(&c, &[1.0, 2.0, 3.0], &[3]);
                exe.execute(&[vec![&a, &b]]).unwrap()[0][0]
                    .to_host::<f32>()
                    .unwrap()
            })
        })
        .collect();
    let results: Vec<Vec<f32>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(results, vec![vec![1.0, 2.0, 3.0], vec![2.0, 3.0, 4.0]]);
}
