//! Run configuration (`configs/*.yaml`): which backends with which settings, which
//! implementations with which options and memory budgets, how many repetitions, and the
//! expected failures. Unknown keys are errors naming file and line; each backend's own
//! settings are its own struct ([`crate::backends::BackendsConfig`]), validated there. A
//! file may start from another (`extends: base.yaml`, see [`Config::load_unchecked`]).
//!
//! ```yaml
//! repeats: 3          # timed executions per trial
//! warmup: 1           # untimed executions first
//! trial_timeout_s: 3600   # one trial of `grpo-suite run`
//! export_timeout_s: 600   # one module of the exporter (import, check, trace, export)
//! backends:
//!   reference: {implementations: [oracle, naive_f32]}
//!   pjrt-cpu:
//!     plugin: null            # default: the venv's xla_cpu_pjrt; env GRPO_PJRT_PLUGIN overrides
//!     cpu_device_count: 1
//!     implementations:
//!       - jax_baseline
//!       - {id: pallas_logits, enabled: false, options: {bwd_impl: pallas, block_v: 2048}}
//!       - {id: pallas_fused, name: pallas_fused@8x512, options: {block_tokens: 8}, cases: "*/d8-*"}
//! expected_failures:
//!   - {implementation: pallas_logits@8x512, cases: "logits/f16/*", reason: "...", link: "issue 42"}
//! ```

pub mod entry;
pub mod expected;

pub use entry::{
    cases_glob_covers, check_implementations, enabled, glob_match, impl_list, resolve_entry_paths,
    ImplConfig, ImplEntry,
};
pub use expected::{ExpectedFailure, ExpectedKind};

use crate::backends::registry::{BackendsConfig, RawBackends};
use crate::precision_class::ClassRule;
use anyhow::{anyhow, bail, Context, Result};
use expected::check_expected;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Default configuration file, relative to the repository root.
pub const DEFAULT_CONFIG: &str = "configs/default.yaml";
/// Default configuration of a `--features tpu` build (adds the `pjrt-tpu` backend).
pub const TPU_CONFIG: &str = "configs/tpu.yaml";

/// A whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Timed executions per trial.
    #[serde(default = "default_repeats")]
    pub repeats: usize,
    /// Untimed warm-up executions per trial.
    #[serde(default = "default_warmup")]
    pub warmup: usize,
    /// Seconds one trial of `grpo-suite run` may take before its worker process is
    /// killed and the trial recorded as timed out.
    #[serde(default = "default_trial_timeout")]
    pub trial_timeout_s: u64,
    /// Seconds the exporter may spend on one implementation's module (importing the
    /// implementation's Python module, checking its entry, tracing and exporting one case)
    /// before it is killed and that implementation's trials are errors.
    #[serde(default = "default_export_timeout")]
    pub export_timeout_s: u64,
    /// Backends by name, each with its own settings (parsed from `raw_backends` by each
    /// section's registered kind).
    #[serde(skip)]
    pub backends: BackendsConfig,
    /// The `backends:` mapping as read.
    #[serde(rename = "backends")]
    raw_backends: RawBackends,
    /// Known failures: the trials run, a failure is reported as expected, a pass fails the run.
    #[serde(default)]
    pub expected_failures: Vec<ExpectedFailure>,
    /// The precision class trajectory trials must reach (a class, or one per input dtype);
    /// default: `bf16` for bf16 and f16 inputs, `f32` for f32 (docs/spec.md, "Precision
    /// classes"). An entry's own `min_precision_class` overrides it.
    #[serde(default)]
    pub min_precision_class: Option<crate::precision_class::ClassRule>,
    /// The file this configuration came from (for messages).
    #[serde(skip)]
    pub origin: String,
    /// The files it was read from, a base before the file that extends it (empty when
    /// parsed from text): what a run's identity digests.
    #[serde(skip)]
    pub sources: Vec<PathBuf>,
}

/// A configuration file that starts from another: `extends: BASE` (a path relative to
/// this file) and the keys it changes. A backend it names replaces the base's backend
/// of that name whole; its `expected_failures` are added to the base's; `repeats`,
/// `warmup`, the timeouts and `min_precision_class`, when given, replace the base's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Extension {
    #[serde(default)]
    extends: Option<PathBuf>,
    repeats: Option<usize>,
    warmup: Option<usize>,
    trial_timeout_s: Option<u64>,
    export_timeout_s: Option<u64>,
    #[serde(default)]
    backends: RawBackends,
    #[serde(default)]
    expected_failures: Vec<ExpectedFailure>,
    min_precision_class: Option<crate::precision_class::ClassRule>,
}

/// How deep `{`/`[` may nest in a configuration: far more than any configuration needs,
/// and a bound on the YAML parser's recursion (200,000 nested braces took it minutes).
pub const MAX_NESTING: usize = 64;

/// Refuses text whose flow collections (`{`, `[`, outside quoted strings and comments)
/// nest deeper than [`MAX_NESTING`], naming the line, before the YAML parser sees it.
fn check_nesting(text: &str, origin: &str) -> Result<()> {
    let mut depth = 0usize;
    for (k, line) in text.lines().enumerate() {
        let mut quote: Option<char> = None;
        for ch in line.chars() {
            match (quote, ch) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '\'' | '"') => quote = Some(ch),
                (None, '#') => break,
                (None, '{' | '[') => {
                    depth += 1;
                    if depth > MAX_NESTING {
                        bail!("{origin}: line {}: `{{`/`[` nest deeper than {MAX_NESTING}: not a configuration", k + 1);
                    }
                }
                (None, '}' | ']') => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
    }
    Ok(())
}

/// Whether YAML `text` has `key` at the top level (a line starting `key:`).
fn top_level_key(text: &str, key: &str) -> bool {
    // Read as YAML, so a quoted (`"extends": …`) or flow-style (`{extends: …}`) key counts.
    serde_yaml_ng::from_str::<serde_yaml_ng::Value>(text)
        .ok()
        .and_then(|v| v.as_mapping().map(|m| m.contains_key(key)))
        .unwrap_or(false)
}

/// Checks the timeouts a file gives: each at least 1 second.
fn check_timeouts(origin: &str, trial: Option<u64>, export: Option<u64>) -> Result<()> {
    if export == Some(0) {
        bail!("{origin}: export_timeout_s must be at least 1 (seconds per exported module)");
    }
    if trial == Some(0) {
        bail!("{origin}: trial_timeout_s must be a whole number of seconds ≥ 1 (got 0)");
    }
    Ok(())
}

fn default_repeats() -> usize {
    3
}
fn default_warmup() -> usize {
    1
}
fn default_trial_timeout() -> u64 {
    3600
}
fn default_export_timeout() -> u64 {
    600
}

impl Config {
    /// Parses YAML text; `origin` names the file in errors. A file that `extends` another
    /// is read with [`Config::load`], which knows where the base lies.
    pub fn parse(text: &str, origin: &str) -> Result<Config> {
        let mut c = Config::parse_unfolded(text, origin)?;
        c.fold_class_rule();
        Ok(c)
    }

    /// [`Config::parse`] without [`Config::fold_class_rule`] (a base that an extension may
    /// give another `min_precision_class`).
    fn parse_unfolded(text: &str, origin: &str) -> Result<Config> {
        check_nesting(text, origin)?;
        if top_level_key(text, "extends") {
            bail!("{origin}: `extends` names a base configuration relative to this file; read it with --config FILE");
        }
        let mut c: Config = serde_yaml_ng::from_str(text).map_err(|e| anyhow!("{origin}: {e}"))?;
        c.backends = BackendsConfig::parse(std::mem::take(&mut c.raw_backends), origin, text)?;
        c.origin = origin.to_string();
        check_timeouts(origin, Some(c.trial_timeout_s), Some(c.export_timeout_s))?;
        c.backends.validate(origin)?;
        check_expected(origin, &c.backends, &mut c.expected_failures)?;
        Ok(c)
    }

    /// Reads a file, and checks that every path it names exists.
    pub fn load(path: &Path) -> Result<Config> {
        let c = Config::load_unchecked(path)?;
        c.backends.check_paths(&c.origin)?;
        Ok(c)
    }

    /// Reads a file (paths resolved against the directory of the file that names them)
    /// without checking that the plugins, interpreters and `pythonpath` entries it names
    /// exist here. A file with `extends: BASE` is BASE with its own keys over it
    /// ([`Extension`]).
    pub fn load_unchecked(path: &Path) -> Result<Config> {
        let mut c = Config::load_chain(path, &mut Vec::new())?;
        c.fold_class_rule();
        Ok(c)
    }

    /// Puts the configuration's `min_precision_class` beneath every entry's own
    /// ([`ClassRule::over`]), so that an entry alone says which class it must reach, and
    /// so which class's baseline its speed budget compares with (docs/tpu.md).
    fn fold_class_rule(&mut self) {
        let Some(config) = self.min_precision_class.clone() else {
            return;
        };
        self.backends.for_each_entry(|e| {
            let mut c = e.resolved();
            c.min_precision_class = ClassRule::over(c.min_precision_class.as_ref(), Some(&config));
            *e = ImplEntry::Full(c);
        });
    }

    /// [`Config::load_unchecked`], `chain` holding the files that extend this one (to
    /// refuse a cycle).
    fn load_chain(path: &Path, chain: &mut Vec<PathBuf>) -> Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config {}", path.display()))?;
        let origin = path.display().to_string();
        check_nesting(&text, &origin)?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if !top_level_key(&text, "extends") {
            let mut c = Config::parse_unfolded(&text, &origin)?;
            c.backends.resolve_paths(&dir);
            c.sources = vec![path.to_path_buf()];
            return Ok(c);
        }
        let x: Extension = serde_yaml_ng::from_str(&text).map_err(|e| anyhow!("{origin}: {e}"))?;
        let Some(extends) = x.extends.clone().filter(|e| !e.as_os_str().is_empty()) else {
            bail!("{origin}: `extends` is empty: it names the base configuration, a path relative to this file (`extends: default.yaml`)");
        };
        let base_path = dir.join(&extends);
        let me = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        chain.push(me);
        let base_id = std::fs::canonicalize(&base_path).map_err(|e| {
            anyhow!(
                "{origin}: extends `{}`: cannot read {} ({e})",
                extends.display(),
                base_path.display()
            )
        })?;
        if chain.contains(&base_id) {
            let names: Vec<String> = chain
                .iter()
                .chain(std::iter::once(&base_id))
                .map(|p| p.display().to_string())
                .collect();
            bail!(
                "{origin}: extends `{}`, a cycle: {}",
                extends.display(),
                names.join(" → ")
            );
        }
        let mut c = Config::load_chain(&base_path, chain)?;
        let mut backends = BackendsConfig::parse(x.backends, &origin, &text)?;
        backends.validate(&origin)?;
        backends.resolve_paths(&dir);
        c.backends.overlay(backends);
        let mut own = x.expected_failures;
        check_expected(&origin, &c.backends, &mut own)?;
        c.expected_failures.extend(own);
        if let Some(v) = x.repeats {
            c.repeats = v;
        }
        if let Some(v) = x.warmup {
            c.warmup = v;
        }
        if x.min_precision_class.is_some() {
            c.min_precision_class = x.min_precision_class;
        }
        check_timeouts(&origin, x.trial_timeout_s, x.export_timeout_s)?;
        c.trial_timeout_s = x.trial_timeout_s.unwrap_or(c.trial_timeout_s);
        c.export_timeout_s = x.export_timeout_s.unwrap_or(c.export_timeout_s);
        c.origin = origin;
        c.sources.push(path.to_path_buf());
        Ok(c)
    }

    /// The default configuration of the repository.
    pub fn load_default() -> Result<Config> {
        Config::load(&crate::repo_root().join(DEFAULT_CONFIG))
    }

    /// The configuration path a front end uses: `explicit` if given, else `GRPO_CONFIG`,
    /// else the nightly config for the nightly suite, else `configs/tpu.yaml` in a build
    /// with the `tpu` feature, else the default.
    pub fn path_for(explicit: Option<&Path>, suite: crate::cases::Suite) -> Result<PathBuf> {
        if let Some(p) = explicit {
            return Ok(p.to_path_buf());
        }
        if let Some(p) = crate::env::config()? {
            return Ok(p);
        }
        let file = if suite == crate::cases::Suite::Nightly {
            "configs/nightly.yaml"
        } else if cfg!(feature = "tpu") {
            TPU_CONFIG
        } else {
            DEFAULT_CONFIG
        };
        Ok(crate::repo_root().join(file))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typo_is_an_error_with_line() {
        let e = Config::parse(
            "repeats: 3\nbackends:\n  pjrt-cpu:\n    implementations: [a]\n    plugn: x\n",
            "c.yaml",
        )
        .unwrap_err()
        .to_string();
        // A section's own field: the section and its line.
        assert!(
            e.contains("c.yaml: backends.pjrt-cpu (line 3): unknown field `plugn`"),
            "{e}"
        );
        let e = Config::parse("backends:\n  pjrt-tpuu: {implementations: []}\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown backend `pjrt-tpuu` (line 2)"), "{e}");
        // A top-level typo keeps serde's own line.
        let e = Config::parse("repeats: 3\nrepets: 4\nbackends: {}\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("repets") && e.contains("line 2"), "{e}");
    }

    #[test]
    fn export_timeout_defaults_and_must_be_positive() {
        let c = Config::parse(
            "backends:\n  reference: {implementations: [oracle]}\n",
            "c.yaml",
        )
        .unwrap();
        assert_eq!(c.export_timeout_s, 600);
        let e = Config::parse(
            "export_timeout_s: 0\nbackends:\n  reference: {implementations: [oracle]}\n",
            "c.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("c.yaml") && e.contains("export_timeout_s must be at least 1"),
            "{e}"
        );
    }

    #[test]
    fn backend_settings_belong_to_their_backend() {
        // `cpu_device_count` is a pjrt-cpu setting: the reference backend rejects it.
        let e = Config::parse(
            "backends:\n  reference: {implementations: [oracle], cpu_device_count: 2}\n",
            "c.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("cpu_device_count"), "{e}");
        let e = Config::parse(
            "backends:\n  pjrt-cpu: {implementations: [a], cpu_device_count: 0}\n",
            "c.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("cpu_device_count") && e.contains("≥ 1"), "{e}");
    }

    #[test]
    fn entries_resolve() {
        let c = Config::parse(
            "backends:\n  pjrt-cpu:\n    implementations:\n      - jax_baseline\n      - {id: p, enabled: false, options: {block_v: 512}}\n",
            "c",
        )
        .unwrap();
        let b = c
            .backends
            .get::<crate::backends::pjrt::PjrtCpuConfig>("pjrt-cpu")
            .unwrap();
        assert_eq!(enabled(&b.implementations).len(), 1);
        assert_eq!(b.implementations[1].resolved().options["block_v"], 512);
        assert_eq!(c.repeats, 3);
    }

    #[test]
    fn entry_topologies_are_checked_in_one_line() {
        let parse = |yaml: &str| {
            Config::parse(yaml, "c.yaml")
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        let aot = |topologies: &str| {
            format!("backends:\n  tpu-aot:\n    topologies: [v6e:2x2, tpu7x:2x2x1]\n    implementations: [a, {{id: a, name: a7, topologies: {topologies}}}]\n")
        };
        parse(&aot("[tpu7x:2x2x1]")).unwrap();
        let e = parse(&aot("[v5e:2x2]")).unwrap_err();
        assert!(e.contains("c.yaml: backend `tpu-aot`, implementation `a7`: topology `v5e:2x2` is not one of the backend's (v6e:2x2, tpu7x:2x2x1)"), "{e}");
        let e = parse(&aot("[]")).unwrap_err();
        assert!(
            e.contains("implementation `a7`: `topologies` is empty"),
            "{e}"
        );
        let e = parse(
            "backends:\n  pjrt-cpu:\n    implementations: [{id: a, topologies: [v6e:2x2]}]\n",
        )
        .unwrap_err();
        assert!(
            e.contains(
                "backend `pjrt-cpu`, implementation `a`: `topologies` names `tpu-aot` topologies"
            ),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn budgets_and_expected_failures_are_checked() {
        let e = Config::parse(
            "backends:\n  reference:\n    implementations: [{id: oracle, max_peak_over_floor: 0.5}]\n",
            "c.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("max_peak_over_floor must be a number ≥ 1"),
            "{e}"
        );
        let speed = |backend: &str, v: &str| {
            Config::parse(&format!("backends:\n  {backend}:\n    topologies: [v6e:2x2]\n    implementations: [{{id: pallas_fused, max_roofline_over_baseline: {v}}}]\n"), "c.yaml")
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        speed("tpu-aot", "1.0").unwrap();
        assert!(speed("tpu-aot", "0")
            .unwrap_err()
            .contains("max_roofline_over_baseline must be a positive number"));
        assert!(speed("tpu-aot", ".nan")
            .unwrap_err()
            .contains("positive number"));
        // A bound per generation names every generation the entry compiles for.
        speed("tpu-aot", "{v6e: 1.2}").unwrap();
        let two = |imp: &str| {
            Config::parse(&format!("backends:\n  tpu-aot:\n    topologies: [v5e:2x2, v6e:2x2, tpu7x:2x2x1]\n    implementations: [{imp}]\n"), "c.yaml")
        };
        let e = two("{id: pallas_fused, max_roofline_over_baseline: {v5e: 1.05, v6e: 1.2}}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("implementation `pallas_fused`: max_roofline_over_baseline gives no bound for tpu7x"), "{e}");
        let c = two("{id: pallas_fused, topologies: [v5e:2x2, v6e:2x2], max_roofline_over_baseline: {v5e: 1.05, v6e: 1.2}, speed_cases: \"*_t8*\"}").unwrap();
        let imp = c
            .backends
            .get::<crate::backends::pjrt::TpuAotConfig>("tpu-aot")
            .unwrap()
            .implementations[0]
            .resolved();
        assert_eq!(
            imp.speed_budget_on("fused/b1_t8_v2", "v5e:2x2"),
            Ok(Some(1.05))
        );
        assert_eq!(
            imp.speed_budget_on("fused/b1_t8_v2", "v6e:2x4"),
            Ok(Some(1.2))
        );
        assert!(imp
            .speed_budget_on("fused/b1_t8_v2", "tpu7x:2x2x1")
            .is_err());
        assert_eq!(
            imp.speed_budget_on("fused/b1_t4_v2", "v6e:2x4"),
            Ok(None),
            "speed_cases still select"
        );
        assert!(speed("tpu-aot", "{v4: 1.2}")
            .unwrap_err()
            .contains("names `v4`, which is not a TPU generation"));
        let e = Config::parse("backends:\n  tpu-aot:\n    topologies: [v4:2x2]\n    implementations: [{id: pallas_fused, max_roofline_over_baseline: {v6e: 1.2}}]\n", "c.yaml").unwrap_err().to_string();
        assert!(
            e.contains("topology `v4:2x2` is of no generation in the roofline table"),
            "{e}"
        );
        assert!(speed("tpu-aot", "{v6e: 0}")
            .unwrap_err()
            .contains("v6e: must be a positive number"));
        let e = Config::parse("backends:\n  pjrt-cpu:\n    implementations: [{id: pallas_fused, max_roofline_over_baseline: 1.0}]\n", "c.yaml").unwrap_err().to_string();
        assert!(e.contains("judged by `tpu-aot`"), "{e}");
        let e = Config::parse(
            "backends:\n  reference: {implementations: [oracle]}\nexpected_failures:\n  - {implementation: oracle, reason: ''}\n",
            "c.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("needs a `reason`"), "{e}");
        // A backend glob names the backends it matches.
        let c = Config::parse(
            "backends:\n  reference: {implementations: [oracle]}\n  tpu-aot: {topologies: [v6e:2x2, tpu7x:2x2x1], implementations: [jax_baseline]}\nexpected_failures:\n  - {implementation: jax_baseline, backend: \"tpu-aot-*\", reason: r, expect: {roofline_over_baseline: 1.5}}\n",
            "c.yaml",
        )
        .unwrap();
        let ef = &c.expected_failures[0];
        assert!(
            ef.matches("tpu-aot-tpu7x-2x2x1", "jax_baseline", "x")
                && ef.matches("tpu-aot-v6e-2x2", "jax_baseline", "x")
        );
        assert!(!ef.matches("pjrt-tpu", "jax_baseline", "x"));
        let e = Config::parse("backends:\n  reference: {implementations: [oracle]}\nexpected_failures:\n  - {implementation: oracle, backend: \"tpu-aot-*\", reason: r}\n", "c.yaml").unwrap_err().to_string();
        assert!(e.contains("is not configured"), "{e}");
    }

    #[test]
    fn globs() {
        assert!(glob_match("*", "logits/f32/x"));
        assert!(glob_match("logits/*", "logits/f32/x"));
        assert!(glob_match("*/f32/*", "logits/f32/x"));
        assert!(!glob_match("*/bf16/*", "logits/f32/x"));
        assert!(glob_match("logits/f32/x", "logits/f32/x"));
        assert!(!glob_match("logits/f32", "logits/f32/x"));
        assert!(glob_match("a*b*c", "a--b--c"));
        assert!(glob_match("*_t4_*|*_t8_*", "logits/f32/b1_t8_v9/x"));
        assert!(!glob_match("*_t4_*|*_t8_*", "logits/f32/b1_t16_v9/x"));
        assert!(!cases_glob_covers(
            "!*_t4_*|*_t8_*",
            "logits/f32/b1_t8_v9/x"
        ));
        assert!(!glob_match("a*b*c", "a--c--b"));
        assert!(cases_glob_covers("*/f32/*", "logits/f32/x"));
        assert!(!cases_glob_covers("!*/f32/*", "logits/f32/x"));
        assert!(cases_glob_covers("!*/bf16/*", "logits/f32/x"));
    }

    /// An expected failure states its figure as data: none, an unknown one, a bad value
    /// or range, or a bad margin is a one-line configuration error naming the entry.
    #[test]
    fn an_expected_failure_states_a_known_figure() {
        let parse = |entry: &str| {
            Config::parse(
                &format!("backends:\n  reference: {{implementations: [oracle]}}\nexpected_failures:\n  - {{implementation: oracle, reason: r{entry}}}\n"),
                "c.yaml",
            )
        };
        let err = |entry: &str| parse(entry).unwrap_err().to_string();
        assert!(err("").contains("expected_failures[0] (oracle on *): states no figure"));
        assert!(err(", expect: {speed: 1.3}").contains("unknown figure `speed`"));
        assert!(err(", expect: {dlm_head: 0}")
            .contains("figure `dlm_head` must be a finite number > 0"));
        assert!(err(", expect: {dlm_head: [3e-1, 2e-3]}").contains("out of order"));
        assert!(
            err(", expect: {dlm_head: 1e-3}, margin: 1.5").contains("`margin` must be a fraction")
        );
        for ok in [
            ", expect: {dlm_head: 1e-3}",
            ", expect: {drift_over_bound: [174, 929]}, margin: 0.2",
            ", errors: true",
        ] {
            let c = parse(ok).unwrap();
            assert_eq!(c.expected_failures.len(), 1, "{ok}");
        }
    }
}

/// Every backend's enabled implementation names (reference included), for tests.
#[cfg(test)]
fn names_by_backend(c: &Config) -> Vec<(String, Vec<String>)> {
    c.backends
        .sections()
        .map(|(n, s)| (n, s.entries()))
        .map(|(n, l)| {
            let v = enabled(l)
                .iter()
                .map(|i| i.display_name().to_string())
                .collect();
            (n.to_string(), v)
        })
        .collect()
}

#[cfg(test)]
mod extends_tests {
    use super::*;

    fn names(c: &Config, backend: &str) -> Vec<String> {
        names_by_backend(c)
            .into_iter()
            .find(|(b, _)| b == backend)
            .map(|(_, v)| v)
            .unwrap_or_default()
    }

    const BASE: &str = "repeats: 3\nbackends:\n  reference: {implementations: [oracle]}\n  pjrt-cpu:\n    implementations:\n      - {id: 'k:IMPL', name: k, pythonpath: [kernels]}\nexpected_failures:\n  - {implementation: k, backend: pjrt-cpu, expect: {dlm_head: 1e-3}, reason: base}\n";

    #[test]
    fn a_file_that_extends_another_is_the_base_with_its_own_keys_over_it() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("base.yaml"), BASE).unwrap();
        std::fs::write(
            d.path().join("sub/top.yaml"),
            "extends: ../base.yaml\nrepeats: 5\nbackends:\n  pjrt-tpu:\n    implementations:\n      - {id: 'j:IMPL', name: j, pythonpath: [mine]}\n  reference: {implementations: [oracle, naive_f32]}\nexpected_failures:\n  - {implementation: j, expect: {dlm_head: 1e-3}, backend: pjrt-tpu, reason: top}\n",
        )
        .unwrap();
        let c = Config::load_unchecked(&d.path().join("sub/top.yaml")).unwrap();
        assert_eq!((c.repeats, c.warmup), (5, 1));
        // A backend it names replaces the base's; the others are the base's.
        assert_eq!(names(&c, "reference"), ["oracle", "naive_f32"]);
        assert_eq!(names(&c, "pjrt-cpu"), ["k"]);
        assert_eq!(names(&c, "pjrt-tpu"), ["j"]);
        // Expected failures: the base's, then its own.
        let reasons: Vec<&str> = c
            .expected_failures
            .iter()
            .map(|e| e.reason.as_str())
            .collect();
        assert_eq!(reasons, ["base", "top"]);
        // Each names the file that holds it, and its index there (a stale entry of the
        // base is blamed on the base, not on the file that extends it).
        let at: Vec<&str> = c.expected_failures.iter().map(|e| e.at.as_str()).collect();
        assert_eq!(
            at,
            [
                format!(
                    "{}: expected_failures[0]",
                    d.path().join("sub/../base.yaml").display()
                ),
                format!(
                    "{}: expected_failures[0]",
                    d.path().join("sub/top.yaml").display()
                )
            ]
        );
        // Paths against the directory of the file that names them.
        let path_of = |backend: &str| {
            c.backends
                .exported_lists()
                .into_iter()
                .find(|(b, _)| *b == backend)
                .map(|(_, l)| enabled(l)[0].pythonpath[0].clone())
                .unwrap()
        };
        assert_eq!(path_of("pjrt-cpu"), d.path().join("sub/../kernels"));
        assert_eq!(path_of("pjrt-tpu"), d.path().join("sub/mine"));
        assert_eq!(
            c.origin,
            d.path().join("sub/top.yaml").display().to_string()
        );
        assert_eq!(
            c.sources,
            [
                d.path().join("sub/../base.yaml"),
                d.path().join("sub/top.yaml")
            ]
        );
    }

    /// The configuration's `min_precision_class` lies beneath each entry's own, the one
    /// of the file that extends taking the base's place: an entry alone then says what it
    /// must reach (and so which class's baseline its speed compares with).
    #[test]
    fn the_config_class_rule_is_folded_into_every_entry_after_extends() {
        use crate::precision_class::{required, PrecisionClass};
        use crate::spec::DType;
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("base.yaml"),
            "min_precision_class: f32
backends:
  pjrt-cpu:
    implementations:
      - jax_baseline
      - {id: xla_chunked, name: x, min_precision_class: {bf16: bf16x3}}
",
        )
        .unwrap();
        std::fs::write(
            d.path().join("top.yaml"),
            "extends: base.yaml
min_precision_class: {f32: tf32}
",
        )
        .unwrap();
        let class = |path: &str, name: &str, dtype| {
            let c = Config::load_unchecked(&d.path().join(path)).unwrap();
            let list = c.backends.exported_lists();
            let e = enabled(list.into_iter().find(|(b, _)| *b == "pjrt-cpu").unwrap().1)
                .into_iter()
                .find(|e| e.display_name() == name)
                .unwrap();
            required(e.min_precision_class.as_ref(), None, dtype)
        };
        assert_eq!(
            class("base.yaml", "jax_baseline", DType::Bf16),
            PrecisionClass::F32
        );
        assert_eq!(class("base.yaml", "x", DType::Bf16), PrecisionClass::Bf16x3);
        assert_eq!(class("base.yaml", "x", DType::F32), PrecisionClass::F32);
        // The extension's rule replaces the base's beneath the entries, not over them.
        assert_eq!(
            class("top.yaml", "jax_baseline", DType::F32),
            PrecisionClass::Tf32
        );
        assert_eq!(
            class("top.yaml", "jax_baseline", DType::Bf16),
            PrecisionClass::Bf16
        );
        assert_eq!(class("top.yaml", "x", DType::Bf16), PrecisionClass::Bf16x3);
        assert_eq!(class("top.yaml", "x", DType::F32), PrecisionClass::Tf32);
    }

    #[test]
    fn a_bad_extends_is_one_line_naming_the_file() {
        let d = tempfile::tempdir().unwrap();
        let err = |name: &str, text: &str| {
            let p = d.path().join(name);
            std::fs::write(&p, text).unwrap();
            let e = format!("{:#}", Config::load_unchecked(&p).unwrap_err());
            assert!(!e.contains('\n'), "{e}");
            assert!(e.contains(&p.display().to_string()), "{e}");
            e
        };
        let e = err("a.yaml", "extends: nowhere.yaml\n");
        assert!(e.contains("extends `nowhere.yaml`: cannot read"), "{e}");
        err("b.yaml", "extends: c.yaml\n");
        let e = err("c.yaml", "extends: b.yaml\n");
        assert!(
            e.contains("a cycle") && e.contains("b.yaml → ") && e.contains("c.yaml"),
            "{e}"
        );
        let e = err("self.yaml", "extends: self.yaml\n");
        assert!(e.contains("a cycle"), "{e}");
        std::fs::write(d.path().join("base.yaml"), BASE).unwrap();
        let e = err("typo.yaml", "extends: base.yaml\nrepeat: 5\n");
        assert!(e.contains("repeat") && e.contains("line 2"), "{e}");
        let e = err(
            "ef.yaml",
            "extends: base.yaml\nexpected_failures:\n  - {implementation: k, backend: pjrt-gpu, reason: r}\n",
        );
        assert!(
            e.contains("expected_failures[0]: backend `pjrt-gpu` is not configured"),
            "{e}"
        );
        let e = err("zero.yaml", "extends: base.yaml\ntrial_timeout_s: 0\n");
        assert!(e.contains("trial_timeout_s must be a whole number"), "{e}");
        let e = Config::parse("extends: base.yaml\n", "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t.yaml: `extends`"), "{e}");
        // An empty `extends` names no file (it read the directory before).
        for (k, text) in ["extends:\n", "extends: ''\n"].iter().enumerate() {
            let e = err(&format!("empty{k}.yaml"), text);
            assert!(e.contains("`extends` is empty"), "{e}");
        }
    }

    /// `extends` quoted or written in flow style is still `extends` (it was an unknown
    /// field).
    #[test]
    fn extends_is_read_as_yaml_whatever_its_style() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("base.yaml"), BASE).unwrap();
        for (k, text) in [
            "\"extends\": base.yaml\nrepeats: 5\n",
            "'extends': base.yaml\nrepeats: 5\n",
            "{extends: base.yaml, repeats: 5}\n",
        ]
        .iter()
        .enumerate()
        {
            let p = d.path().join(format!("x{k}.yaml"));
            std::fs::write(&p, text).unwrap();
            let c = Config::load_unchecked(&p).unwrap_or_else(|e| panic!("{text}: {e:#}"));
            assert_eq!(c.repeats, 5, "{text}");
            assert_eq!(c.sources.len(), 2, "{text}");
        }
    }

    /// A speed budget of the wrong type says what it may be, not serde's "did not match
    /// any variant of untagged enum".
    #[test]
    fn a_speed_budget_of_the_wrong_type_says_what_it_may_be() {
        let parse = |b: &str| {
            Config::parse(&format!("backends:\n  tpu-aot:\n    topologies: [v6e:2x2]\n    implementations: [{{id: pallas_fused, max_roofline_over_baseline: {b}}}]\n"), "c.yaml")
        };
        for bad in ["[1.2]", "yes", "'fast'"] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("a number (one bound") && !e.contains("untagged"),
                "{bad}: {e}"
            );
        }
        let e = parse("{v6e: '1.2'}").unwrap_err().to_string();
        assert!(
            e.contains("generation `v6e`")
                && e.contains("the bound is a number")
                && !e.contains("untagged"),
            "{e}"
        );
        parse("1.2").unwrap();
        parse("2").unwrap();
        parse("{v6e: 1.2}").unwrap();
    }

    #[test]
    fn an_edit_of_the_base_changes_the_identity_of_a_run_under_the_extending_file() {
        let d = tempfile::tempdir().unwrap();
        let (base, top) = (d.path().join("base.yaml"), d.path().join("top.yaml"));
        std::fs::write(&base, BASE).unwrap();
        std::fs::write(&top, "extends: base.yaml\n").unwrap();
        let digest = || {
            let c = Config::load_unchecked(&top).unwrap();
            crate::run_identity::RunIdentity::of("ci", &top, &c)
                .unwrap()
                .config_digest
        };
        let before = digest();
        assert_eq!(before, digest());
        std::fs::write(&base, BASE.replace("repeats: 3", "repeats: 4")).unwrap();
        assert_ne!(
            before,
            digest(),
            "the base's bytes are part of the identity"
        );
    }
}

#[cfg(test)]
mod shipped {
    /// Every suffix of an option-set name (`@BLOCKS-suffix-suffix`) in the shipped
    /// configurations is defined in docs/configs.md's table ("Option-set names").
    #[test]
    fn every_option_set_suffix_is_documented() {
        let root = crate::repo_root();
        let doc = std::fs::read_to_string(root.join("docs/configs.md")).unwrap();
        let documented: Vec<&str> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("| `-"))
            .filter_map(|l| l.split('`').next())
            .collect();
        assert!(documented.len() >= 10, "{documented:?}");
        let mut files = vec![];
        for d in [
            "configs",
            "examples/external_kernel",
            "examples/tokamax",
            "examples/mllm_jax",
        ] {
            for e in std::fs::read_dir(root.join(d)).unwrap() {
                let p = e.unwrap().path();
                if p.extension().is_some_and(|x| x == "yaml") {
                    files.push(p);
                }
            }
        }
        let mut missing = Vec::new();
        for f in &files {
            let text = std::fs::read_to_string(f).unwrap();
            for (i, _) in text.match_indices("name: ") {
                let name: String = text[i + 6..]
                    .trim_start_matches(['"', '\''])
                    .chars()
                    .take_while(|c| !matches!(c, ',' | '}' | '"' | '\'' | ' ' | '\n'))
                    .collect();
                let Some((_, set)) = name.split_once('@') else {
                    continue;
                };
                for suffix in set.split('-').skip(1) {
                    if !documented.contains(&suffix) {
                        missing.push(format!("{}: {name}: -{suffix}", f.display()));
                    }
                }
            }
        }
        assert!(missing.is_empty(), "undocumented suffixes: {missing:#?}");
    }

    /// The shipped configurations' files (configs/, each example's).
    fn shipped_files() -> Vec<std::path::PathBuf> {
        let root = crate::repo_root();
        let mut files = vec![];
        for d in [
            "configs",
            "examples/external_kernel",
            "examples/tokamax",
            "examples/tunix",
            "examples/mllm_jax",
        ] {
            for e in std::fs::read_dir(root.join(d)).unwrap() {
                let p = e.unwrap().path();
                if p.extension().is_some_and(|x| x == "yaml") {
                    files.push(p);
                }
            }
        }
        files
    }

    /// The numbers written in `text` (`1.98x`, `rel 1.53e-3`, `3.0`), as written.
    fn numbers_in(text: &str) -> Vec<(String, f64)> {
        let mut out = Vec::new();
        let b = text.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i].is_ascii_digit()
                && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
            {
                let start = i;
                while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
                    i += 1;
                }
                if i + 1 < b.len()
                    && b[i] == b'e'
                    && (b[i + 1] == b'-' || b[i + 1].is_ascii_digit())
                {
                    i += 2;
                    while i < b.len() && b[i].is_ascii_digit() {
                        i += 1;
                    }
                }
                let tok = text[start..i].trim_end_matches('.');
                if let Ok(v) = tok.parse::<f64>() {
                    out.push((tok.to_string(), v));
                }
            } else {
                i += 1;
            }
        }
        out
    }

    /// An expected failure states each figure once, in `expect:`: its reason keeps the
    /// cause in words (a figure in both places is corrected in one and left wrong in the
    /// other). A number in the reason equal to a stated figure (to 0.5 %, a figure other
    /// than a small count) is refused.
    #[test]
    fn no_expected_failures_reason_repeats_its_figures() {
        let mut found = Vec::new();
        let mut n = 0;
        for f in shipped_files() {
            let c = super::Config::load_unchecked(&f).unwrap_or_else(|e| panic!("{e:#}"));
            for e in &c.expected_failures {
                n += 1;
                let values: Vec<f64> = e
                    .expect
                    .values()
                    .flat_map(|v| {
                        let (a, b) = v.bounds();
                        [a, b]
                    })
                    .collect();
                for (tok, r) in numbers_in(&e.reason) {
                    let small_count = r.fract() == 0.0 && r < 100.0 && !tok.contains(['.', 'e']);
                    if !small_count && values.iter().any(|&v| (r - v).abs() <= 5e-3 * v.abs()) {
                        found.push(format!(
                            "{}: {} ({}): `{tok}` in the reason",
                            f.display(),
                            e.describe(),
                            e.reason
                        ));
                    }
                }
            }
        }
        assert!(n > 50, "{n} entries");
        assert!(
            found.is_empty(),
            "{} reason(s) repeat a figure:\n{}",
            found.len(),
            found.join("\n")
        );
    }

    #[test]
    fn every_shipped_config_loads() {
        let dir = crate::repo_root().join("configs");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            if e.path().extension().is_some_and(|x| x == "yaml") {
                super::Config::load(&e.path()).unwrap_or_else(|err| panic!("{err:#}"));
                n += 1;
            }
        }
        assert!(n >= 4, "{n} configs");
    }

    /// The configurations for TPU VMs are their CPU machine's twins plus pjrt-tpu: every
    /// other backend lists the same implementations (they drifted apart as copies).
    #[test]
    fn the_tpu_configs_are_their_bases_plus_pjrt_tpu() {
        let root = crate::repo_root();
        for (tpu, base) in [
            ("configs/tpu.yaml", "configs/default.yaml"),
            ("configs/nightly-tpu.yaml", "configs/nightly.yaml"),
        ] {
            let t = super::Config::load(&root.join(tpu)).unwrap();
            let b = super::Config::load(&root.join(base)).unwrap();
            let lists = |c: &super::Config| {
                let mut v = super::names_by_backend(c);
                v.retain(|(n, _)| n != "pjrt-tpu");
                v
            };
            assert_eq!(lists(&t), lists(&b), "{tpu} against {base}");
            assert_eq!(
                t.backends.names().len(),
                b.backends.names().len() + 1,
                "{tpu}"
            );
            assert!(t.backends.has("pjrt-tpu"), "{tpu}");
            let base_entries = b.expected_failures.len();
            assert_eq!(
                t.expected_failures[..base_entries],
                b.expected_failures[..],
                "{tpu}"
            );
        }
    }
}

#[cfg(test)]
mod rule_tests {
    use super::Config;

    /// Configurations that would check nothing, or hang the parser, are refused in one
    /// line that names what and where.
    #[test]
    fn rules_that_accept_what_checks_nothing_are_refused() {
        for (text, want) in [
            (
                "backends:\n  pjrt-cpu: {implementations: [jax_baseline]}\nexpected_failures:\n  - {implementation: jax_baseline, reason: r, expect: {dlm_head: high}}\n",
                "figure `dlm_head`: a figure's value is a number",
            ),
            (
                "min_precision_class: {}\nbackends:\n  pjrt-cpu: {implementations: [jax_baseline]}\n",
                "names no class",
            ),
            (
                "backends:\n  pjrt-cpu: {implementations: [{id: jax_baseline, min_precision_class: {}}]}\n",
                "names no class",
            ),
            (
                "backends:\n  reference: {implementations: [{id: oracle, min_precision_class: bf16}]}\n",
                "nothing on `reference` is judged by class",
            ),
            (
                "backends:\n  pjrt-cpu: {implementations: []}\n",
                "backend `pjrt-cpu` lists no implementation",
            ),
        ] {
            let e = Config::parse(text, "c.yaml").unwrap_err().to_string();
            assert!(e.contains(want) && !e.contains('\n'), "{text}: {e}");
        }
        let deep = format!(
            "backends: {}1{}\n",
            "{a: ".repeat(100_000),
            "}".repeat(100_000)
        );
        let t = std::time::Instant::now();
        let e = Config::parse(&deep, "c.yaml").unwrap_err().to_string();
        assert!(e.contains("nest deeper than 64"), "{e}");
        assert!(t.elapsed().as_secs() < 5);
        // Quoted braces and comments are not nesting.
        let quoted = format!(
            "# {}\nbackends:\n  reference: {{implementations: [oracle]}}\nexpected_failures: []\n",
            "{".repeat(100)
        );
        Config::parse(&quoted, "c.yaml").unwrap();
    }
}
