//! Run configuration (`configs/*.yaml`): which backends, which implementations with
//! which options, how many repetitions. Unknown keys are errors naming file and line.
//!
//! ```yaml
//! repeats: 3          # timed executions per trial
//! warmup: 1           # untimed executions first
//! backends:
//!   reference: {implementations: [oracle, naive_f32]}
//!   pjrt-cpu:
//!     plugin: null            # default: the venv's xla_cpu_pjrt; env GRPO_PJRT_PLUGIN overrides
//!     cpu_device_count: 1
//!     implementations:
//!       - jax_baseline
//!       - {id: pallas_logits, enabled: false, options: {bwd_impl: pallas, block_v: 2048}}
//! ```

use anyhow::{anyhow, Context, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Default configuration file, relative to the repository root.
pub const DEFAULT_CONFIG: &str = "configs/default.yaml";

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
    /// Backends by name.
    pub backends: BTreeMap<String, BackendConfig>,
    /// Implementations whose TPU export (Mosaic lowering, no TPU needed) is checked per case.
    #[serde(default)]
    pub tpu_export: Vec<ImplEntry>,
}

fn default_repeats() -> usize {
    3
}
fn default_warmup() -> usize {
    1
}

/// One backend's settings.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// PJRT plugin path (PJRT backends; `GRPO_PJRT_PLUGIN` overrides).
    #[serde(default)]
    pub plugin: Option<PathBuf>,
    /// CPU plugin: number of devices of the client.
    #[serde(default)]
    pub cpu_device_count: Option<i64>,
    /// Implementations to run, in order.
    pub implementations: Vec<ImplEntry>,
}

/// An implementation: just its id, or id with switches and options.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ImplEntry {
    /// `- jax_baseline`
    Id(String),
    /// `- {id: ..., enabled: ..., options: {...}}`
    Full(ImplConfig),
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
}

fn yes() -> bool {
    true
}

impl ImplEntry {
    /// The normalised form.
    pub fn resolved(&self) -> ImplConfig {
        match self {
            ImplEntry::Id(id) => ImplConfig { id: id.clone(), name: None, enabled: true, options: Default::default() },
            ImplEntry::Full(c) => c.clone(),
        }
    }
}

impl ImplConfig {
    /// The name trials and records use.
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.id)
    }
}

impl BackendConfig {
    /// Enabled implementations.
    pub fn enabled(&self) -> Vec<ImplConfig> {
        self.implementations.iter().map(ImplEntry::resolved).filter(|c| c.enabled).collect()
    }
}

impl Config {
    /// Parses YAML text; `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config> {
        let c: Config = serde_yaml_ng::from_str(text).map_err(|e| anyhow!("{origin}: {e}"))?;
        for (name, b) in &c.backends {
            let mut ids: Vec<String> =
                b.implementations.iter().map(|e| e.resolved().display_name().to_string()).collect();
            ids.sort();
            if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
                return Err(anyhow!(
                    "{origin}: backend `{name}` lists implementation `{}` twice (give one a distinct `name`)",
                    w[0]
                ));
            }
            if !crate::backend::KNOWN.contains(&name.as_str()) {
                return Err(anyhow!(
                    "{origin}: unknown backend `{name}`, expected one of: {}",
                    crate::backend::KNOWN.join(", ")
                ));
            }
        }
        Ok(c)
    }

    /// Reads a file.
    pub fn load(path: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config {}", path.display()))?;
        Config::parse(&text, &path.display().to_string())
    }

    /// The default configuration of the repository.
    pub fn load_default() -> Result<Config> {
        Config::load(&crate::repo_root().join(DEFAULT_CONFIG))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typo_is_an_error_with_line() {
        let e = Config::parse("repeats: 3\nbackends:\n  pjrt-cpu:\n    implementations: [a]\n    plugn: x\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("c.yaml") && e.contains("plugn") && e.contains("line 5"), "{e}");
        let e = Config::parse("backends:\n  pjrt-tpuu: {implementations: []}\n", "c.yaml").unwrap_err().to_string();
        assert!(e.contains("unknown backend `pjrt-tpuu`"), "{e}");
    }

    #[test]
    fn entries_resolve() {
        let c = Config::parse(
            "backends:\n  pjrt-cpu:\n    implementations:\n      - jax_baseline\n      - {id: p, enabled: false, options: {block_v: 512}}\n",
            "c",
        )
        .unwrap();
        let b = &c.backends["pjrt-cpu"];
        assert_eq!(b.enabled().len(), 1);
        assert_eq!(b.implementations[1].resolved().options["block_v"], 512);
        assert_eq!(c.repeats, 3);
    }
}
