//! Calling the Python exporter (`python -m grpo_jax.export`) in batches and reading its
//! manifests. One process per batch: jax starts once, cached artifacts are reused.
//!
//! One job per module: `protocol` the protocol's constants, `process` supervising an
//! exporter process, `pyenv` the Python environment and its probe, `manifest` what the
//! exporter writes, `batch` exporting a batch of requests, `check_config` checking the
//! configured implementations, `compile_failure` explaining a module's compile failure,
//! `exporter` a backend's exporter and its answers.

mod batch;
mod check_config;
mod compile_failure;
mod exporter;
mod manifest;
mod process;
mod protocol;
mod pyenv;

pub use batch::{export_batch, write_atomically, Exported, Platform};
pub use compile_failure::{explain_compile_failure, pinned_jax_version};
pub use exporter::{entry, find, names, Exporter};
pub use manifest::{ImplInfo, Manifest, TensorSpec};
pub use process::{set_timeout, timeout};
pub use protocol::PROTOCOL;
pub use pyenv::PyEnv;

#[cfg(test)]
mod tests;
