//! What the integration tests share: the suite's binary run with arguments.
#![allow(dead_code)] // each test crate uses what it needs

use std::process::{Command, Output};

/// `grpo-suite ARGS`, without the caller's GRPO_REQUIRE_BACKENDS (command 2 sets it for
/// the conformance runs; a test's own run names its backends).
pub fn suite(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grpo-suite"))
        .env_remove("GRPO_REQUIRE_BACKENDS")
        .args(args)
        .output()
        .unwrap()
}

/// Its stdout and stderr, for a failing assertion's message.
pub fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
