//! Expected failures: the entries a configuration lists, what trials each covers, the
//! figure each states, and their checks.

use super::entry::glob_match;
use crate::backends::BackendsConfig;
use anyhow::{bail, Result};
use serde::Deserialize;

/// Checks expected-failure entries: each has a reason, and names a configured backend.
pub(super) fn check_expected(
    origin: &str,
    backends: &BackendsConfig,
    list: &mut [ExpectedFailure],
) -> Result<()> {
    for (k, e) in list.iter_mut().enumerate() {
        e.at = format!("{origin}: expected_failures[{k}]");
        if e.reason.trim().is_empty() {
            bail!(
                "{origin}: expected_failures[{k}] ({}) needs a `reason`",
                e.describe()
            );
        }
        if let Some(b) = &e.backend {
            if !backends
                .names()
                .iter()
                .any(|n| b == n || b.starts_with(&format!("{n}-")) || glob_match(b, n))
            {
                bail!("{origin}: expected_failures[{k}]: backend `{b}` is not configured");
            }
        }
    }
    for (k, e) in list.iter().enumerate() {
        let at = || format!("{origin}: expected_failures[{k}] ({})", e.describe());
        if e.expect.is_empty() && !e.errors {
            bail!(
                "{}: states no figure: add `expect: {{FIGURE: VALUE}}` with the measured figure ({})",
                at(),
                crate::judge::figure::Figure::NAMES
            );
        }
        for (name, v) in &e.expect {
            if crate::judge::figure::Figure::parse(name).is_none() {
                bail!(
                    "{}: unknown figure `{name}` in `expect` (one of {})",
                    at(),
                    crate::judge::figure::Figure::NAMES
                );
            }
            if let Err(why) = v.check() {
                bail!("{}: figure `{name}` {why}", at());
            }
        }
        if let Some(m) = e.margin {
            if !(m.is_finite() && m > 0.0 && m < 1.0) {
                bail!("{}: `margin` must be a fraction in (0, 1), not {m}", at());
            }
        }
    }
    Ok(())
}

/// A known, tracked failure (wasmtime's `should_fail` discipline): the matching trials
/// still run; a failure (or, with `errors`, an error) is "expected", a pass is an error
/// asking to remove the entry, and an entry that matches no trial of the suite is an
/// error (stale).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ExpectedFailure {
    /// Implementation name as in trial names (`pallas_logits@8x512`).
    pub implementation: String,
    /// Backend name, or a `*`-glob of names such as `tpu-aot-*` (default: any backend).
    #[serde(default)]
    pub backend: Option<String>,
    /// Case-id pattern: `*` matches any run of characters (default: every case).
    #[serde(default = "star")]
    pub cases: String,
    /// Why it fails.
    pub reason: String,
    /// Where it is tracked (an issue, a link, a note).
    #[serde(default)]
    pub link: Option<String>,
    /// Which trials it covers: `run` (default: single calls, `cases` matching the case
    /// id) or `trajectory` (trajectory trials, `cases` matching `<case id>/<trajectory>`).
    #[serde(default)]
    pub kind: ExpectedKind,
    /// Whether the entry also covers trials that end in an error (not judged: an export,
    /// compile or contract error, a crash, a timeout). By default it covers failures only
    /// (gates or budgets judged and missed), and an error under it stays an error.
    #[serde(default)]
    pub errors: bool,
    /// The failure as measured, by figure ([`crate::judge::figure::Figure`]):
    /// `roofline_over_baseline`, `peak_over_floor`, `drift_over_bound`,
    /// `undeclared_matmuls`, or an output's norm-wise relative error by its name; a value
    /// or `[least, most]` over the trials the entry covers. Each
    /// names the kind of failure it stands for; a trial that fails otherwise, or whose
    /// figure moved past `margin`, reports the entry stale. Required unless `errors`.
    #[serde(default, deserialize_with = "expect_map")]
    pub expect: std::collections::BTreeMap<String, crate::judge::figure::Expect>,
    /// How far a figure may move, as a fraction of it (default 0.10: ±10 %).
    #[serde(default)]
    pub margin: Option<f64>,
    /// Where it is written: `file: expected_failures[k]`, the file that holds it (a base
    /// configuration's entry names the base, not the file that extends it). Set on load.
    #[serde(skip)]
    pub at: String,
}

/// The kind of trial an expected failure covers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpectedKind {
    /// `backend/implementation/case` trials.
    #[default]
    Run,
    /// `trajectory/backend/implementation/case/trajectory` trials.
    Trajectory,
}

fn star() -> String {
    "*".into()
}

/// `expect:`, each value read with its figure's name in the message when it is not a
/// number or a `[least, most]` pair.
fn expect_map<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<std::collections::BTreeMap<String, crate::judge::figure::Expect>, D::Error> {
    use serde::de::Error;
    let raw = std::collections::BTreeMap::<String, serde_yaml_ng::Value>::deserialize(d)?;
    raw.into_iter()
        .map(|(k, v)| {
            serde_yaml_ng::from_value(v)
                .map(|e| (k.clone(), e))
                .map_err(|e| D::Error::custom(format!("figure `{k}`: {e}")))
        })
        .collect()
}

impl ExpectedFailure {
    /// Whether the entry covers the run trial (backend, implementation, case id).
    pub fn matches(&self, backend: &str, implementation: &str, case_id: &str) -> bool {
        self.kind == ExpectedKind::Run && self.covers(backend, implementation, case_id)
    }

    /// Whether the entry covers the trajectory trial (backend, implementation,
    /// `<case id>/<trajectory label>`).
    pub fn matches_trajectory(&self, backend: &str, implementation: &str, key: &str) -> bool {
        self.kind == ExpectedKind::Trajectory && self.covers(backend, implementation, key)
    }

    fn covers(&self, backend: &str, implementation: &str, case_id: &str) -> bool {
        self.implementation == implementation
            && self
                .backend
                .as_deref()
                .is_none_or(|b| glob_match(b, backend))
            && glob_match(&self.cases, case_id)
    }

    /// One-line description for messages.
    pub fn describe(&self) -> String {
        format!(
            "{}{}{} on {}{}",
            if self.kind == ExpectedKind::Trajectory {
                "trajectory/"
            } else {
                ""
            },
            self.backend
                .as_ref()
                .map(|b| format!("{b}/"))
                .unwrap_or_default(),
            self.implementation,
            self.cases,
            self.link
                .as_ref()
                .map(|l| format!(" ({l})"))
                .unwrap_or_default()
        )
    }
}
