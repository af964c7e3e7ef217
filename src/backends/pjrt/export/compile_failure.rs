//! Explaining a module's compile failure when its exporter's jax is not the pinned one.

use super::manifest::Manifest;
use anyhow::anyhow;
use std::path::Path;

/// The jax version `backends/jax/requirements.lock` pins: what the suite's plugins are
/// known to accept.
pub fn pinned_jax_version() -> &'static str {
    include_str!("../../../../backends/jax/requirements.lock")
        .lines()
        .find_map(|l| l.trim().strip_prefix("jax=="))
        .unwrap_or("?")
}

/// A compile failure of a module, explained when its exporter's jax is not the pinned
/// one: a newer jax can emit StableHLO an older plugin cannot read (e.g. libtpu 0.0.42.1
/// on a jax 0.11.2 export: "unregistered operation 'vhlo.custom_call_v2'"). One line
/// naming both versions and the fix (`config_key` or the environment variable `env_key`
/// names the plugin), then the plugin's own message.
pub fn explain_compile_failure(
    err: anyhow::Error,
    manifest: &Manifest,
    plugin: &Path,
    config_key: &str,
    env_key: &str,
) -> anyhow::Error {
    let pinned = pinned_jax_version();
    // Only compile failures (pjrt-cpu's worker: "compile of <module>: ...", tpu-aot:
    // "TPU compile for <topology> failed: ..."), never run errors.
    let text = format!("{err:#}");
    let compile = text.starts_with("compile of") || text.starts_with("TPU compile for");
    if manifest.jax_version == pinned || !compile {
        return err;
    }
    // The plugin's own message spans lines (MLIR notes): one line, like every trial error.
    let plugin_error = text.split_whitespace().collect::<Vec<_>>().join(" ");
    anyhow!(
        "the module of `{}` was exported by jax {} but the PJRT plugin {} is tested with jax {pinned} (this suite's pin) and could not compile it: a newer jax may emit StableHLO the plugin cannot read; install a plugin built for jax {} and set `{config_key}` (or {}) to it, or export with jax {pinned} (docs/external.md). Plugin error: {plugin_error}",
        manifest.implementation,
        manifest.jax_version,
        plugin.display(),
        manifest.jax_version,
        env_key
    )
}
