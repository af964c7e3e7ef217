//! The exporter protocol (`grpo_jax.protocol`): its version, exit status and progress markers.

/// The exporter protocol this suite speaks (`grpo_jax.protocol.PROTOCOL_VERSION`): passed
/// as `--protocol` to every exporter command and checked by the probe, so a `grpo_jax`
/// installed in a user's environment from another checkout is one clear line.
pub const PROTOCOL: u32 = 1;

/// Exit status of the exporter on a protocol mismatch.
pub(super) const MISMATCH_EXIT: i32 = 4;

/// The prefix of the exporter's progress lines on stderr (`grpo_jax.protocol`).
pub(super) const MARKER_PREFIX: &str = "grpo-exporter: ";
/// Progress: the exporter's own imports (Python, jax, `grpo_jax`) are done
/// (`grpo_jax.protocol.READY_MARKER` without the prefix).
pub(super) const READY: &str = "ready";
/// Progress: the `--check-config` entry whose index follows is being checked
/// (`grpo_jax.protocol.CHECK_MARKER` without the prefix).
pub(super) const CHECKING: &str = "checking ";
