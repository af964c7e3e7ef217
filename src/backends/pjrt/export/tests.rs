//! Tests of the exporter: sharding a batch, explaining compile failures.

use super::batch::shard_by_implementation;
use super::*;
use anyhow::anyhow;
use std::path::{Path, PathBuf};

#[test]
fn an_entry_pythonpath_goes_before_the_inherited_one_kept_whole() {
    let env = |dirs: &[&str]| PyEnv {
        python: PathBuf::from("python3"),
        pythonpath: dirs.iter().map(PathBuf::from).collect(),
    };
    let pp = |e: &PyEnv, inherited: Option<&str>| {
        e.child_pythonpath(inherited.map(Into::into))
            .map(|v| v.into_string().unwrap())
    };
    let ext = env(&["configs/../examples/external_kernel"]);
    // The GPU machine's case (scripts/gpu_check.sh puts the checkout's backends/jax
    // before a PYTHONPATH the machine already had): the inherited value holds several
    // directories. It was dropped whole (join_paths refuses an element holding `:`,
    // and the fallback was empty), and grpo_jax with it.
    assert_eq!(
        pp(&ext, Some("/c/backends/jax:/opt/image")).as_deref(),
        Some("configs/../examples/external_kernel:/c/backends/jax:/opt/image")
    );
    assert_eq!(
        pp(&ext, Some("/c/backends/jax")).as_deref(),
        Some("configs/../examples/external_kernel:/c/backends/jax")
    );
    assert_eq!(pp(&env(&["/a", "/b"]), None).as_deref(), Some("/a:/b"));
    assert_eq!(pp(&env(&["/a"]), Some("")).as_deref(), Some("/a"));
    // No directories of its own: the inherited PYTHONPATH is left as it is.
    assert_eq!(pp(&env(&[]), Some("/x:/y")), None);
}

#[test]
fn shards_keep_each_implementation_whole_and_balance_the_rest() {
    let names = ["a", "b", "a", "c", "b", "a", "d"];
    // One job: everything, in order.
    assert_eq!(
        shard_by_implementation(&names, 1),
        vec![(0..7).collect::<Vec<_>>()]
    );
    // Two jobs, largest first to the lighter shard: a (3) | b (2), c (1) to b's (2 < 3),
    // then d to the first of the two equal shards; indices in order.
    let two = shard_by_implementation(&names, 2);
    assert_eq!(two, vec![vec![0, 2, 5, 6], vec![1, 3, 4]]);
    // More jobs than implementations: one shard each, none empty.
    let many = shard_by_implementation(&names, 8);
    assert_eq!(many.len(), 4);
    for s in &many {
        let first = names[s[0]];
        assert!(s.iter().all(|&k| names[k] == first), "{many:?}");
    }
    // Every index exactly once.
    let mut all: Vec<usize> = many.concat();
    all.sort_unstable();
    assert_eq!(all, (0..7).collect::<Vec<_>>());
    assert!(shard_by_implementation(&[], 2).is_empty());
}

fn manifest(jax: &str) -> Manifest {
    Manifest {
        implementation: "mine:IMPL".into(),
        platform: "cpu".into(),
        jax_version: jax.into(),
        key: "k".into(),
        inputs: vec![],
        outputs: vec![],
        not_provided: vec![],
        num_partitions: 1,
        kernels: vec![],
        kernel_cost_error: None,
        f32_dots: Vec::new(),
        declared_precision: None,
        option_class: None,
        round_trips: Vec::new(),
        emulates: None,
    }
}

#[test]
fn a_compile_failure_of_another_jax_names_both_versions_and_the_fix() {
    let pinned = pinned_jax_version();
    assert!(
        pinned.chars().next().is_some_and(|c| c.is_ascii_digit()),
        "{pinned}"
    );
    let plugin = Path::new("/p/xla_cpu.so");
    let e = explain_compile_failure(
        // The plugin's message spans lines (as xla_cpu_pjrt's MLIR notes do).
        anyhow!("compile of m: unknown op vhlo.foo_v9\n  -:0:0: note: in bytecode version 6\n"),
        &manifest("0.99.0"),
        plugin,
        "backends.pjrt-cpu.plugin",
        crate::env::PJRT_PLUGIN,
    );
    let m = format!("{e:#}");
    assert!(
        m.contains("jax 0.99.0") && m.contains(&format!("jax {pinned}")),
        "{m}"
    );
    assert!(
        m.contains("backends.pjrt-cpu.plugin")
            && m.contains("/p/xla_cpu.so")
            && m.contains("vhlo.foo_v9")
            && m.contains("foo_v9 -:0:0: note: in bytecode version 6"),
        "{m}"
    );
    assert_eq!(m.lines().count(), 1, "{m}");
    // The pinned jax: the plugin's message as is.
    let e = explain_compile_failure(
        anyhow!("compile of m: boom"),
        &manifest(pinned),
        plugin,
        "x",
        "Y",
    );
    assert_eq!(format!("{e:#}"), "compile of m: boom");
    // Another jax, but not a compile failure: as is.
    let e = explain_compile_failure(
        anyhow!("execute: out of memory"),
        &manifest("0.99.0"),
        plugin,
        "x",
        "Y",
    );
    assert_eq!(format!("{e:#}"), "execute: out of memory");
    // tpu-aot's compile error (libtpu 0.0.42.1 on a jax 0.11.2 export) names libtpu's
    // setting and variable.
    let e = explain_compile_failure(
        anyhow!("TPU compile for v6e:2x2 failed: unregistered operation 'vhlo.custom_call_v2' found in dialect ('vhlo') that does not allow unknown operations"),
        &manifest("0.11.2"),
        Path::new("/v/libtpu/libtpu.so"),
        "backends.tpu-aot.plugin",
        crate::env::LIBTPU,
    );
    let m = format!("{e:#}");
    assert!(
        m.contains("jax 0.11.2")
            && m.contains(&format!("jax {pinned}"))
            && m.contains("backends.tpu-aot.plugin")
            && m.contains("GRPO_LIBTPU")
            && m.contains("vhlo.custom_call_v2")
            && m.lines().count() == 1,
        "{m}"
    );
}
