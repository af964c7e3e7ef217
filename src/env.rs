//! Every `GRPO_*` environment variable the suite reads, in one table, with one parser
//! each. Front ends call [`check_all`] at start-up so an invalid value is one clear line
//! before any work, never a silent default. docs/environment.md mirrors [`VARS`] (a test
//! keeps them in step).

use anyhow::{bail, Result};
use std::path::PathBuf;

/// One environment variable: name, meaning, default, who reads it.
#[derive(Debug, Clone, Copy)]
pub struct Var {
    /// Name.
    pub name: &'static str,
    /// What it means.
    pub meaning: &'static str,
    /// Value when unset.
    pub default: &'static str,
    /// Who reads it.
    pub read_by: &'static str,
}

/// The repository root.
pub const ROOT: &str = "GRPO_ROOT";
/// Run configuration of the test harness.
pub const CONFIG: &str = "GRPO_CONFIG";
/// Suite of the test harness.
pub const SUITE: &str = "GRPO_SUITE";
/// Backends that must be available.
pub const REQUIRE_BACKENDS: &str = "GRPO_REQUIRE_BACKENDS";
/// Tolerance multiplier.
pub const TOL_SCALE: &str = "GRPO_TOL_SCALE";
/// Rewrite golden files instead of checking them.
pub const BLESS: &str = "GRPO_BLESS";
/// Python interpreter of the exporter.
pub const PYTHON: &str = "GRPO_PYTHON";
/// Artifact cache directory.
pub const ARTIFACTS: &str = "GRPO_ARTIFACTS";
/// CPU PJRT plugin.
pub const PJRT_PLUGIN: &str = "GRPO_PJRT_PLUGIN";
/// libtpu shared library.
pub const LIBTPU: &str = "GRPO_LIBTPU";
/// Record file of the test harness.
pub const RECORDS: &str = "GRPO_RECORDS";
/// XLA:CPU's backend optimization level for `pjrt-cpu` compiles.
pub const CPU_OPT_LEVEL: &str = "GRPO_XLA_CPU_OPT_LEVEL";
/// Whether `pjrt-cpu` compiles use XLA:CPU's MLIR fusion emitters.
pub const CPU_FUSION_EMITTERS: &str = "GRPO_XLA_CPU_FUSION_EMITTERS";
/// The test harness's shard of the plan (`I/N`, as `run --partition`).
pub const PARTITION: &str = "GRPO_PARTITION";
/// Records whose measured seconds weigh the harness's split (as `--partition-weights`).
pub const PARTITION_WEIGHTS: &str = "GRPO_PARTITION_WEIGHTS";
/// Set by the suite for its exporter: an implementation entry's `pythonpath` directories,
/// whose `.py` files are part of the export's cache key.
pub const ENTRY_PYTHONPATH: &str = "GRPO_ENTRY_PYTHONPATH";
/// Allows a tolerance scale above [`MAX_TOL_SCALE`].
pub const ALLOW_LOOSE: &str = "GRPO_ALLOW_LOOSE_TOLERANCES";
/// The largest tolerance multiplier accepted without [`ALLOW_LOOSE`]: the `loose` tier's 10×.
pub const MAX_TOL_SCALE: f64 = 10.0;

/// The table (docs/environment.md is generated from the same rows and checked by a test).
pub const VARS: &[Var] = &[
    Var { name: ROOT, meaning: "repository root: where `cases/`, `configs/`, `golden/` are found", default: "the working directory or its nearest ancestor with `cases/` and `configs/`, else the source directory the binary was built from", read_by: "everything" },
    Var { name: CONFIG, meaning: "run configuration file", default: "`configs/nightly.yaml` for the nightly suite, else `configs/tpu.yaml` in a `--features tpu` build, else `configs/default.yaml`", read_by: "test harness, `grpo-suite run` (when `--config` is not given)" },
    Var { name: SUITE, meaning: "suite of the test harness: smoke, ci, nightly or full", default: "`ci`", read_by: "test harness" },
    Var { name: REQUIRE_BACKENDS, meaning: "comma-separated backends that must be available: an unavailable one is a failing trial instead of an ignored one", default: "none (`scripts/test.sh` sets `reference,pjrt-cpu,tpu-aot-v6e-2x2`)", read_by: "test harness, `grpo-suite run`" },
    Var { name: TOL_SCALE, meaning: "multiplies every tolerance, and k of the trajectory gate (docs/trajectory.md) (a finite number > 0; 0.1 is a stricter run); shown in the summary and in every record when ≠ 1", default: "1", read_by: "gates" },
    Var { name: ALLOW_LOOSE, meaning: "`1`: accept a `GRPO_TOL_SCALE` above 10 (a run that loosens every gate that much is otherwise refused)", default: "unset", read_by: "gates" },
    Var { name: CPU_OPT_LEVEL, meaning: "XLA:CPU's backend (LLVM) optimization level of `pjrt-cpu` compiles, 0 to 3 (XLA's `xla_backend_optimization_level`): at 0 the ci tier's small modules take about a third less CPU time, with the same verdicts (docs/backends.md); TPU and GPU compiles are not affected. `scripts/test.sh` sets 0", default: "unset: XLA's default", read_by: "`pjrt-cpu`" },
    Var { name: CPU_FUSION_EMITTERS, meaning: "`0`: `pjrt-cpu` compiles use XLA:CPU's elemental IR emitters instead of its MLIR fusion emitters (XLA's `xla_cpu_use_fusion_emitters=false`): the ci tier's conformance run takes a third less CPU time and pytest half, with the same verdicts (docs/backends.md); `1` forces the fusion emitters; TPU and GPU compiles are not affected. `scripts/test.sh` sets 0", default: "unset: XLA's default (fusion emitters)", read_by: "`pjrt-cpu`" },
    Var { name: BLESS, meaning: "`1`: the harness rewrites golden files instead of checking them", default: "unset (check)", read_by: "test harness" },
    Var { name: PYTHON, meaning: "Python interpreter that runs the exporter (`grpo_jax`)", default: "`.venv/bin/python`", read_by: "PJRT backends, `scripts/setup.sh`" },
    Var { name: ARTIFACTS, meaning: "cache directory of exported modules", default: "`target/grpo-artifacts`", read_by: "PJRT backends" },
    Var { name: PJRT_PLUGIN, meaning: "PJRT plugin (.so) of `pjrt-cpu` and `pjrt-gpu`; overrides the config's `plugin` (a plugin of another platform than the backend's is an error)", default: "the venv's `xla_cpu_pjrt` (`pjrt-cpu`), `jax_plugins/xla_cuda13` (`pjrt-gpu`)", read_by: "`pjrt-cpu`, `pjrt-gpu`, grpo-pjrt tests" },
    Var { name: LIBTPU, meaning: "libtpu shared library; overrides the config's `plugin`", default: "the venv's `libtpu/libtpu.so`", read_by: "`tpu-aot`, `pjrt-tpu`" },
    Var { name: RECORDS, meaning: "JSONL record file of the test harness", default: "`target/grpo-records/cargo-test-<suite>-<unix time>.jsonl`", read_by: "test harness" },
    Var { name: PARTITION, meaning: "`I/N`: the test harness runs shard I of N of its plan (whole cases, dealt by estimated cost), the same split as `grpo-suite run --partition I/N`, and writes the shard's stamp beside its records for `grpo-suite merge` (docs/nightly.md, \"Across machines\")", default: "unset: the whole plan", read_by: "test harness" },
    Var { name: PARTITION_WEIGHTS, meaning: "records file whose measured seconds weigh the harness's split (as `run --partition-weights`)", default: "unset: the estimate", read_by: "test harness" },
    Var { name: ENTRY_PYTHONPATH, meaning: "set by the suite for the exporter it starts (not by a user): the implementation entry's `pythonpath` directories, `:`-separated; every `.py` file under them is part of the export's cache key, so an edited helper module is exported again (docs/external.md)", default: "unset (no `pythonpath`)", read_by: "the exporter (`grpo_jax.sources`)" },
    Var { name: "GRPO_PJRT_HEADER_PATH", meaning: "`pjrt_c_api.h` to generate the binding from (build time)", default: "the venv's `xla_cpu_pjrt` wheel", read_by: "grpo-pjrt build script" },
    Var { name: "GRPO_BENCH_SHAPE", meaning: "oracle benchmark shape `BxTxV`", default: "`1x8192x151936`", read_by: "`cargo bench --bench oracle`" },
    Var { name: "GRPO_BENCH_RUNS", meaning: "oracle benchmark runs, and runs of each generation part (generate, fill without page faults, page faults, deviates, counter hashes); medians reported", default: "3", read_by: "`cargo bench --bench oracle`" },
    Var { name: "GRPO_BENCH_COPIES", meaning: "oracle benchmark memory copies per mode (median reported)", default: "5", read_by: "`cargo bench --bench oracle`" },
    Var { name: "GRPO_BENCH_EXACT", meaning: "`1`: the oracle benchmark also times input generation on the scalar path (as before the fast path) and checks its bits", default: "unset", read_by: "`cargo bench --bench oracle`" },
];

pub use crate::shown::{shown, shown_quoted, SHOWN_CHARS};

fn raw(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// A path variable: unset → None; set but empty → error.
fn path(name: &str) -> Result<Option<PathBuf>> {
    match raw(name) {
        None => Ok(None),
        Some(s) if s.trim().is_empty() => bail!("{name} is set but empty; unset it or give a path"),
        Some(s) => Ok(Some(PathBuf::from(s))),
    }
}

/// `GRPO_CONFIG`.
pub fn config() -> Result<Option<PathBuf>> {
    path(CONFIG)
}

/// `GRPO_PYTHON`: a file, or a command name found on `PATH` (as `scripts/setup.sh` uses
/// it, e.g. `python3.12`).
pub fn python() -> Result<Option<PathBuf>> {
    match path(PYTHON)? {
        Some(p) if p.components().count() == 1 && !p.is_file() => {
            let on_path = std::env::var_os("PATH")
                .map(|v| std::env::split_paths(&v).any(|d| d.join(&p).is_file()))
                .unwrap_or(false);
            if !on_path {
                bail!(
                    "{PYTHON}={} is neither a file nor a command on PATH; fix or unset it",
                    p.display()
                );
            }
            Ok(Some(p))
        }
        Some(p) if !p.is_file() => bail!("{PYTHON}={} is not a file; fix or unset it", p.display()),
        other => Ok(other),
    }
}

/// `GRPO_ARTIFACTS`.
pub fn artifacts() -> Result<Option<PathBuf>> {
    path(ARTIFACTS)
}

/// `GRPO_PJRT_PLUGIN` (must name a file when set).
pub fn pjrt_plugin() -> Result<Option<PathBuf>> {
    file(PJRT_PLUGIN)
}

/// `GRPO_LIBTPU` (must name a file when set).
pub fn libtpu() -> Result<Option<PathBuf>> {
    file(LIBTPU)
}

fn file(name: &str) -> Result<Option<PathBuf>> {
    match path(name)? {
        Some(p) if !p.is_file() => bail!(
            "{name}={} is not a file; fix or unset it",
            shown(&p.to_string_lossy())
        ),
        other => Ok(other),
    }
}

/// `GRPO_RECORDS`.
pub fn records() -> Result<Option<PathBuf>> {
    path(RECORDS)
}

/// `GRPO_PARTITION`: the harness's shard (`I/N`), if any, as the text it is set to; the
/// harness parses it as `run --partition` does (`partition::Partition`). Set but empty
/// is an error.
pub fn partition() -> Result<Option<String>> {
    match raw(PARTITION) {
        Some(s) if s.trim().is_empty() => {
            bail!("{PARTITION} is set but empty; unset it or give I/N")
        }
        other => Ok(other),
    }
}

/// `GRPO_PARTITION_WEIGHTS`: the records that weigh the harness's split, if any.
pub fn partition_weights() -> Result<Option<PathBuf>> {
    path(PARTITION_WEIGHTS)
}

/// `GRPO_SUITE` (default `ci`).
pub fn suite() -> Result<crate::cases::Suite> {
    match raw(SUITE) {
        None => Ok(crate::cases::Suite::Ci),
        // The parser's message repeats the value: say the choices instead.
        Some(s) => s.parse().map_err(|_| {
            anyhow::anyhow!("{SUITE}={}: expected smoke, ci, nightly or full", shown(&s))
        }),
    }
}

/// `GRPO_REQUIRE_BACKENDS`, split on commas.
pub fn require_backends() -> Vec<String> {
    raw(REQUIRE_BACKENDS)
        .map(|s| {
            s.split(',')
                .map(|x| x.trim().to_string())
                .filter(|x| !x.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// `GRPO_TOL_SCALE`: a finite number > 0 (default 1); above [`MAX_TOL_SCALE`] only with
/// `GRPO_ALLOW_LOOSE_TOLERANCES=1`.
pub fn tol_scale() -> Result<f64> {
    match raw(TOL_SCALE) {
        None => Ok(1.0),
        Some(s) => match s.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && x > MAX_TOL_SCALE && raw(ALLOW_LOOSE).as_deref() != Some("1") => bail!(
                "{TOL_SCALE}={} loosens every gate beyond the {MAX_TOL_SCALE}× maximum; set {ALLOW_LOOSE}=1 if you mean it",
                shown(&s)
            ),
            Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
            _ => bail!(
                "{TOL_SCALE}={} is not a finite number > 0 (e.g. 0.1 for stricter gates); unset it for 1",
                shown_quoted(&s)
            ),
        },
    }
}

/// `GRPO_BLESS`: `1` or unset (`0` also means no).
pub fn bless() -> Result<bool> {
    match raw(BLESS).as_deref() {
        None | Some("0") | Some("") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => bail!(
            "{BLESS}={}: use 1 to re-bless golden files, or unset it",
            shown_quoted(other)
        ),
    }
}

/// `GRPO_XLA_CPU_OPT_LEVEL`: an integer 0..=3, or unset (XLA's default).
pub fn cpu_opt_level() -> Result<Option<i64>> {
    match raw(CPU_OPT_LEVEL) {
        None => Ok(None),
        Some(s) => match s.trim().parse::<i64>() {
            Ok(n) if (0..=3).contains(&n) => Ok(Some(n)),
            _ => bail!(
                "{CPU_OPT_LEVEL}={}: expected an integer from 0 to 3 (XLA:CPU's backend optimization level), or unset it for XLA's default",
                shown_quoted(&s)
            ),
        },
    }
}

/// `GRPO_XLA_CPU_FUSION_EMITTERS`: `0` (false), `1` (true), or unset (XLA's default).
pub fn cpu_fusion_emitters() -> Result<Option<bool>> {
    match raw(CPU_FUSION_EMITTERS).as_deref().map(str::trim) {
        None => Ok(None),
        Some("0") => Ok(Some(false)),
        Some("1") => Ok(Some(true)),
        Some(other) => bail!(
            "{CPU_FUSION_EMITTERS}={}: expected 0 (XLA:CPU's elemental emitters) or 1 (its fusion emitters), or unset it for XLA's default",
            shown_quoted(other)
        ),
    }
}

/// XLA:CPU's compile settings of `pjrt-cpu` trials as one line, e.g.
/// `opt_level=0 fusion_emitters=0` (`default` where a variable is unset). Records carry
/// it: pjrt-cpu's figures move with it (docs/backends.md), so `--resume` refuses a
/// records file written under other settings and `compare` names the difference.
pub fn xla_cpu_settings() -> Result<String> {
    let opt = cpu_opt_level()?.map_or("default".to_string(), |n| n.to_string());
    let emitters = cpu_fusion_emitters()?.map_or("default", |b| if b { "1" } else { "0" });
    Ok(format!("opt_level={opt} fusion_emitters={emitters}"))
}

/// Validates every variable the suite reads; the first invalid one is the error.
pub fn check_all() -> Result<()> {
    for (name, r) in [
        (CONFIG, config().map(|_| ())),
        (
            ALLOW_LOOSE,
            match raw(ALLOW_LOOSE).as_deref() {
                None | Some("1") | Some("0") => Ok(()),
                Some(v) => Err(anyhow::anyhow!(
                    "{ALLOW_LOOSE}={}: use 1 or unset it",
                    shown_quoted(v)
                )),
            },
        ),
        (PYTHON, python().map(|_| ())),
        (ARTIFACTS, artifacts().map(|_| ())),
        (PJRT_PLUGIN, pjrt_plugin().map(|_| ())),
        (LIBTPU, libtpu().map(|_| ())),
        (RECORDS, records().map(|_| ())),
        (PARTITION, partition().map(|_| ())),
        (PARTITION_WEIGHTS, partition_weights().map(|_| ())),
        (SUITE, suite().map(|_| ())),
        (TOL_SCALE, tol_scale().map(|_| ())),
        (BLESS, bless().map(|_| ())),
        (CPU_OPT_LEVEL, cpu_opt_level().map(|_| ())),
        (CPU_FUSION_EMITTERS, cpu_fusion_emitters().map(|_| ())),
    ] {
        r.map_err(|e| anyhow::anyhow!("{e:#}").context(format!("environment variable {name}")))?;
    }
    if let Some(p) = path(ROOT)? {
        if !p.join("cases").is_dir() {
            bail!(
                "{ROOT}={} has no cases/ directory; point it at the repository root",
                shown(&p.to_string_lossy())
            );
        }
    }
    Ok(())
}

/// The table as Markdown rows (docs/environment.md holds the same rows).
pub fn markdown_table() -> String {
    let mut s =
        String::from("| variable | meaning | default | read by |\n| --- | --- | --- | --- |\n");
    for v in VARS {
        s.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            v.name, v.meaning, v.default, v.read_by
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_in_the_table_once() {
        let mut names: Vec<&str> = VARS.iter().map(|v| v.name).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(n, names.len());
        for k in [
            ROOT,
            CONFIG,
            SUITE,
            REQUIRE_BACKENDS,
            TOL_SCALE,
            BLESS,
            PYTHON,
            ARTIFACTS,
            PJRT_PLUGIN,
            LIBTPU,
            RECORDS,
            ENTRY_PYTHONPATH,
            PARTITION,
            PARTITION_WEIGHTS,
        ] {
            assert!(names.contains(&k), "{k}");
        }
    }

    #[test]
    fn docs_table_matches() {
        let doc = std::fs::read_to_string(crate::repo_root().join("docs/environment.md")).unwrap();
        assert!(
            doc.contains(&markdown_table()),
            "docs/environment.md is out of date; its table must be:\n{}",
            markdown_table()
        );
    }
}
