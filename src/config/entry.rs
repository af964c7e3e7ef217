//! Implementation entries of a backend's configuration (`- jax_baseline`, or an id with
//! options, budgets, a case glob, topologies, an interpreter) and the globs that select
//! cases. Backends read these; this file knows no backend.

use crate::cost::speed_budget::SpeedBudget;
use anyhow::{bail, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Whether an entry's `cases` glob selects `case_id`: a `*`-glob, or after a leading `!`
/// every case the glob does not match.
pub fn cases_glob_covers(glob: &str, case_id: &str) -> bool {
    match glob.strip_prefix('!') {
        Some(g) => !glob_match(g, case_id),
        None => glob_match(glob, case_id),
    }
}

/// `*`-glob match; `a|b` matches what either alternative matches (case ids never hold a
/// `|`). No other metacharacters.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    pattern.split('|').any(|p| one_glob(p, text))
}

fn one_glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    true
}

/// An implementation: just its id, or id with switches and options.
#[derive(Debug, Clone)]
pub enum ImplEntry {
    /// `- jax_baseline`
    Id(String),
    /// `- {id: ..., enabled: ..., options: {...}}`
    Full(ImplConfig),
}

/// Deserializes a backend's `implementations` list; an entry's error names its index
/// (`entry [1]: ...`, counted from 0).
pub fn impl_list<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<ImplEntry>, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Vec<ImplEntry>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a list of implementations")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            use serde::de::Error;
            let mut out = Vec::new();
            loop {
                match seq.next_element::<ImplEntry>() {
                    Ok(Some(e)) => out.push(e),
                    Ok(None) => return Ok(out),
                    Err(e) => return Err(A::Error::custom(format!("entry [{}]: {e}", out.len()))),
                }
            }
        }
    }
    d.deserialize_seq(V)
}

/// The two forms of an implementation entry, for messages.
const IMPL_ENTRY_FORMS: &str =
    "an implementation entry is an id (`- oracle`) or a mapping with an `id` (`- {id: pallas_logits, options: {...}}`)";

impl<'de> Deserialize<'de> for ImplEntry {
    /// A string is an id, a mapping an [`ImplConfig`]; anything else, or a mapping that
    /// is not a valid `ImplConfig`, is an error saying which (serde's path and line name
    /// the entry) and the accepted forms.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error;
        use serde_yaml_ng::Value;
        let v = Value::deserialize(d)?;
        match v {
            Value::String(s) => Ok(ImplEntry::Id(s)),
            Value::Mapping(_) => {
                let id = v.get("id").and_then(Value::as_str).map(str::to_string);
                ImplConfig::deserialize(v)
                    .map(ImplEntry::Full)
                    .map_err(|e| {
                        let which = id.map_or(String::new(), |i| format!("`{i}`: "));
                        D::Error::custom(format!("{which}{e}; {IMPL_ENTRY_FORMS}"))
                    })
            }
            other => {
                let kind = match other {
                    Value::Null => "nothing",
                    Value::Bool(_) => "a boolean",
                    Value::Number(_) => "a number",
                    Value::Sequence(_) => "a list",
                    _ => "a tagged value",
                };
                Err(D::Error::custom(format!("got {kind}; {IMPL_ENTRY_FORMS}")))
            }
        }
    }
}

/// An implementation with its switches (the seeds' `kernel.enabled`, `bwd_impl`, `block_size`
/// become `enabled` and `options`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImplConfig {
    /// Implementation id (what the exporter builds).
    pub id: String,
    /// Name in trial names and records (default: the id); lets one id run with several
    /// option sets, e.g. `pallas_logits@8x512`.
    #[serde(default)]
    pub name: Option<String>,
    /// Whether to run it.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Implementation options, passed to the exporter as `impl_options`.
    #[serde(default)]
    pub options: serde_json::Map<String, serde_json::Value>,
    /// Memory budget: the compiled peak may be at most this multiple of the floor
    /// (arguments + outputs − aliased). Judged where the backend reports a device
    /// compiler's peak (`tpu-aot`, `pjrt-tpu`); absent means "recorded, not judged".
    #[serde(default)]
    pub max_peak_over_floor: Option<f64>,
    /// Fixed allowance of the budget, bytes: peak ≤ max_peak_over_floor × floor + this.
    /// The compiler's per-program overhead (512-byte buffer minimums, scoped temporaries)
    /// does not scale with the shape: it dominates at ci shapes (floors of kilobytes) and
    /// vanishes at production ones (gigabytes).
    #[serde(default)]
    pub peak_slack_bytes: u64,
    /// Speed budget: the implementation's roofline time may be at most this multiple of
    /// jax_baseline's on the same case and TPU generation (both from derived FLOPs and
    /// bytes, docs/tpu.md): one number, or one per generation (`{v5e: 1.05, v6e: 1.2,
    /// tpu7x: 1.4}`, naming every generation the entry compiles for). Judged by
    /// `tpu-aot`; absent means "recorded, not judged".
    #[serde(default)]
    pub max_roofline_over_baseline: Option<SpeedBudget>,
    /// Only cases whose id matches this glob get the speed budget (default: every case the
    /// entry runs): real shapes, not the tiny ones where fixed overheads decide.
    #[serde(default)]
    pub speed_cases: Option<String>,
    /// Python that exports this implementation (default: the suite's venv, or
    /// `GRPO_PYTHON`): an external implementation's own environment, with `grpo_jax`
    /// installed there (docs/external.md). Relative paths are relative to the config file.
    #[serde(default)]
    pub python: Option<PathBuf>,
    /// Directories put first on the exporter's `PYTHONPATH` for this implementation (where
    /// an external `module:attribute` id is imported from). Relative to the config file.
    #[serde(default)]
    pub pythonpath: Vec<PathBuf>,
    /// Only cases whose id matches this glob get a trial of this entry (default: every
    /// case of the suite), e.g. `"*/d8-*"` to run Pallas interpret mode on the small
    /// 8-device cases of the nightly tier and not on its full-size ones; `"!glob"`: every
    /// case but those.
    #[serde(default)]
    pub cases: Option<String>,
    /// `tpu-aot` only: the topologies (of the backend's `topologies`) that compile this
    /// entry (default: every one), for an option set that suits one TPU generation.
    #[serde(default)]
    pub topologies: Option<Vec<String>>,
    /// The precision class this entry's trajectory trials must reach (docs/spec.md,
    /// "Precision classes"): a class, or one per input dtype (`{bf16: bf16x3}`); a dtype
    /// it does not name takes the configuration's `min_precision_class`.
    #[serde(default)]
    pub min_precision_class: Option<crate::precision_class::ClassRule>,
}

fn yes() -> bool {
    true
}

impl ImplEntry {
    /// The normalised form.
    pub fn resolved(&self) -> ImplConfig {
        match self {
            ImplEntry::Id(id) => ImplConfig {
                id: id.clone(),
                name: None,
                enabled: true,
                options: Default::default(),
                max_peak_over_floor: None,
                peak_slack_bytes: 0,
                max_roofline_over_baseline: None,
                speed_cases: None,
                python: None,
                pythonpath: Vec::new(),
                cases: None,
                topologies: None,
                min_precision_class: None,
            },
            ImplEntry::Full(c) => c.clone(),
        }
    }
}

impl ImplConfig {
    /// The speed budget on `case_id` compiled for `topology`: `max_roofline_over_baseline`
    /// (its bound for the topology's generation) where `speed_cases` (default: every case)
    /// matches; `Ok(None)` when there is none, an error when a per-generation budget finds
    /// no bound for the topology.
    pub fn speed_budget_on(&self, case_id: &str, topology: &str) -> Result<Option<f64>, String> {
        let Some(b) = self.max_roofline_over_baseline.as_ref() else {
            return Ok(None);
        };
        if !self
            .speed_cases
            .as_deref()
            .is_none_or(|g| glob_match(g, case_id))
        {
            return Ok(None);
        }
        b.on(topology).map(Some)
    }

    /// The name trials and records use.
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.id)
    }

    /// Whether the id names an implementation outside `grpo_jax` (`module:attribute`).
    pub fn is_external(&self) -> bool {
        self.id.contains(':')
    }
}

/// Makes an entry's `python` and `pythonpath` absolute, relative to `base` (the config
/// file's directory).
pub fn resolve_entry_paths(list: &mut [ImplEntry], base: &Path) {
    for e in list {
        if let ImplEntry::Full(c) = e {
            if let Some(p) = &c.python {
                if p.is_relative() {
                    c.python = Some(base.join(p));
                }
            }
            for p in &mut c.pythonpath {
                if p.is_relative() {
                    *p = base.join(&*p);
                }
            }
        }
    }
}

/// Checks a backend's implementation list: unique names, sane budgets (a per-generation
/// speed budget names every generation of `backend_topologies`, or of the entry's own
/// `topologies`). `origin` and `backend` name the place in errors.
pub fn check_implementations(
    origin: &str,
    backend: &str,
    backend_topologies: &[String],
    list: &[ImplEntry],
) -> Result<()> {
    let mut names: Vec<String> = Vec::new();
    for e in list {
        let c = e.resolved();
        let n = c.display_name().to_string();
        if names.contains(&n) {
            bail!("{origin}: backend `{backend}` lists implementation `{n}` twice (give one a distinct `name`)");
        }
        if let Some(b) = c.max_peak_over_floor {
            if !(b.is_finite() && b >= 1.0) {
                bail!("{origin}: backend `{backend}`, implementation `{n}`: max_peak_over_floor must be a number ≥ 1 (got {b})");
            }
        } else if c.peak_slack_bytes > 0 {
            bail!("{origin}: backend `{backend}`, implementation `{n}`: peak_slack_bytes without max_peak_over_floor");
        }
        if let Some(ts) = &c.topologies {
            if backend != "tpu-aot" {
                bail!("{origin}: backend `{backend}`, implementation `{n}`: `topologies` names `tpu-aot` topologies; move the entry there");
            }
            if ts.is_empty() {
                bail!("{origin}: backend `tpu-aot`, implementation `{n}`: `topologies` is empty (leave it out to compile on every topology)");
            }
        }
        if c.speed_cases.is_some() && c.max_roofline_over_baseline.is_none() {
            bail!("{origin}: backend `{backend}`, implementation `{n}`: speed_cases without max_roofline_over_baseline");
        }
        if let Some(b) = &c.max_roofline_over_baseline {
            if backend != "tpu-aot" {
                bail!("{origin}: backend `{backend}`, implementation `{n}`: max_roofline_over_baseline is judged by `tpu-aot` (deviceless roofline times); move it there");
            }
            let topologies = c.topologies.as_deref().unwrap_or(backend_topologies);
            if let Err(e) = b.check(topologies) {
                bail!("{origin}: backend `{backend}`, implementation `{n}`: max_roofline_over_baseline {e}");
            }
        }
        names.push(n);
    }
    Ok(())
}

/// The enabled entries of a list.
pub fn enabled(list: &[ImplEntry]) -> Vec<ImplConfig> {
    list.iter()
        .map(ImplEntry::resolved)
        .filter(|c| c.enabled)
        .collect()
}
