//! Loading `cases/*.yaml` into a [`Matrix`]: groups expanded by product, zip and lists.
//!
//! File format (every key is checked; an unknown key is an error with file, line, column):
//!
//! ```yaml
//! defaults: {dtype: f32, epsilon_high: 0.28}   # optional, single values
//! groups:
//!   - name: unaligned-vocab
//!     suites: [ci, nightly]
//!     fixed:   {b: 1}                           # single values
//!     product: {dtype: [f32, bf16], loss_type: [grpo, bnpo]}
//!     zip:     {t: [8, 16], v: [2049, 32001]}   # same-length lists, taken together
//!     cases:   [{beta: 0.0}, {beta: 0.04}]       # explicit list of single-value points
//! ```
//! The cases of a group are `cases × product × zip`, each over `defaults ⊕ fixed`.

use super::axes::{Axes, Point};
use super::profiles::{AdvPattern, DataProfile, MaskPattern, TierName};
use super::{Case, Shape};
use crate::spec::{DType, IsLevel, Knobs, Level, LogitsDtype, LossType};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// A named slice of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Suite {
    /// Seconds: the README's first command.
    Smoke,
    /// The `cargo test` tier.
    Ci,
    /// Full shapes (V up to 151936, T up to 8192): `cargo nightly`.
    Nightly,
    /// Every case of every file.
    Full,
}

impl Suite {
    /// Name as written in YAML and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Suite::Smoke => "smoke",
            Suite::Ci => "ci",
            Suite::Nightly => "nightly",
            Suite::Full => "full",
        }
    }
}

impl fmt::Display for Suite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Suite {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "smoke" => Ok(Suite::Smoke),
            "ci" => Ok(Suite::Ci),
            "nightly" => Ok(Suite::Nightly),
            "full" => Ok(Suite::Full),
            _ => Err(format!(
                "unknown suite `{s}`, expected smoke, ci, nightly or full"
            )),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseFile {
    #[serde(default)]
    defaults: Axes,
    groups: Vec<Group>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Group {
    name: String,
    suites: Vec<Suite>,
    #[serde(default)]
    fixed: Axes,
    #[serde(default)]
    product: Axes,
    #[serde(default)]
    zip: Axes,
    #[serde(default)]
    cases: Vec<Axes>,
    /// Trajectory trials of every case of the group (docs/trajectory.md).
    #[serde(default)]
    trajectories: Vec<super::trajectory::TrajectorySpec>,
}

/// Every case of a set of YAML files, sorted by id, ids unique.
#[derive(Debug, Clone, Default)]
pub struct Matrix {
    /// The cases.
    pub cases: Vec<Case>,
}

impl Matrix {
    /// Cases of one suite (`full`: all).
    pub fn suite(&self, suite: Suite) -> Vec<&Case> {
        self.cases
            .iter()
            .filter(|c| suite == Suite::Full || c.suites.contains(&suite))
            .collect()
    }

    /// The case with this id.
    pub fn get(&self, id: &str) -> Option<&Case> {
        self.cases.iter().find(|c| c.id == id)
    }
}

/// Loads every `*.yaml` file of a directory (sorted by name) into one matrix.
pub fn load_dir(dir: &Path) -> Result<Matrix> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read case directory {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    if files.is_empty() {
        bail!("no *.yaml case files in {}", dir.display());
    }
    let mut all = Vec::new();
    for f in &files {
        all.extend(load_file(f)?);
    }
    merge(all)
}

/// Loads the case files of several directories into one matrix (a case defined in two
/// places is merged as within one directory).
pub fn load_dirs(dirs: &[&Path]) -> Result<Matrix> {
    let mut all = Vec::new();
    for dir in dirs {
        all.extend(load_dir(dir)?.cases);
    }
    merge(all)
}

impl Matrix {
    /// This matrix and `other` as one (a case in both is merged as within one directory).
    pub fn merged(self, other: Matrix) -> Result<Matrix> {
        merge(self.cases.into_iter().chain(other.cases).collect())
    }
}

/// Loads one YAML file into its (unsorted, possibly repeated) cases.
pub fn load_file(path: &Path) -> Result<Vec<Case>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read case file {}", path.display()))?;
    parse(&text, &path.display().to_string())
}

/// Parses YAML text; `origin` names the file in error messages.
pub fn parse(text: &str, origin: &str) -> Result<Vec<Case>> {
    let file: CaseFile = serde_yaml_ng::from_str(text).map_err(|e| anyhow!("{origin}: {e}"))?;
    let defaults = single(&file.defaults).map_err(|e| anyhow!("{origin}: defaults: {e}"))?;
    let mut out = Vec::new();
    for (gi, g) in file.groups.iter().enumerate() {
        let ctx = format!("{origin}: group `{}` (groups[{gi}])", g.name);
        let cases = expand_group(g, &defaults, &format!("{origin}#{}", g.name))
            .map_err(|e| anyhow!("{ctx}: {e}"))?;
        if cases.is_empty() {
            bail!("{ctx}: expands to no case");
        }
        out.extend(cases);
    }
    Ok(out)
}

/// One case from a single `fixed:` mapping, e.g. `"b: 2, t: 8, v: 33, beta: 0.04"`
/// (tests and quick experiments; the same defaults and checks as a case file).
///
/// ```
/// let c = grpo_conformance::cases::parse_fixed("b: 1, t: 4, v: 2049, dtype: bf16, delta: 2.0").unwrap();
/// assert_eq!(c.id, "logits/bf16/b1_t4_v2049/grpo/eps0.2-0.2/beta0_delta2/normal1-random-mixed");
/// assert!(grpo_conformance::cases::parse_fixed("b: 1, t: 4, v: 9, delta: 1.1").is_err()); // δ ≤ 1+ε_high
/// ```
pub fn parse_fixed(fixed: &str) -> Result<Case> {
    let yaml = format!("groups:\n  - name: fixed\n    suites: [ci]\n    fixed: {{{fixed}}}\n");
    Ok(parse(&yaml, "fixed")?.remove(0))
}

fn single(a: &Axes) -> Result<Point, String> {
    for (k, n) in a.keys().into_iter().zip(a.lens()) {
        if n != 1 {
            return Err(format!(
                "`{k}` must be a single value here, got a list of {n}"
            ));
        }
    }
    Ok(a.nth(0))
}

fn expand_group(g: &Group, defaults: &Point, origin: &str) -> Result<Vec<Case>, String> {
    if g.suites.is_empty() {
        return Err("`suites` is empty: name at least one of smoke, ci, nightly".into());
    }
    let fixed = single(&g.fixed).map_err(|e| format!("fixed: {e}"))?;
    let zip_lens = g.zip.lens();
    if let Some(&n0) = zip_lens.first() {
        if zip_lens.iter().any(|&n| n != n0) {
            let desc: Vec<String> = g
                .zip
                .keys()
                .iter()
                .zip(&zip_lens)
                .map(|(k, n)| format!("{k}:{n}"))
                .collect();
            return Err(format!("zip lists differ in length ({})", desc.join(", ")));
        }
    }
    let zips: Vec<Point> = match zip_lens.first() {
        Some(&n) => (0..n).map(|i| g.zip.nth(i)).collect(),
        None => vec![Point::default()],
    };
    let explicit: Vec<Point> = if g.cases.is_empty() {
        vec![Point::default()]
    } else {
        g.cases
            .iter()
            .enumerate()
            .map(|(i, c)| single(c).map_err(|e| format!("cases[{i}]: {e}")))
            .collect::<Result<_, _>>()?
    };
    let products = g.product.product();
    let mut out = Vec::new();
    for (ci, c) in explicit.iter().enumerate() {
        for p in &products {
            for z in &zips {
                for (a, b, what) in [
                    (&fixed, c, "fixed and cases"),
                    (&fixed, p, "fixed and product"),
                    (&fixed, z, "fixed and zip"),
                    (c, p, "cases and product"),
                    (c, z, "cases and zip"),
                    (p, z, "product and zip"),
                ] {
                    if let Some(k) = a.overlap(b).first() {
                        return Err(format!("`{k}` is set in both {what}"));
                    }
                }
                let point = defaults.merged(&fixed).merged(c).merged(p).merged(z);
                let mut case =
                    to_case(&point, &g.suites, origin).map_err(|e| format!("cases[{ci}]: {e}"))?;
                for (ti, t) in g.trajectories.iter().enumerate() {
                    t.validate(&case)
                        .map_err(|e| format!("trajectories[{ti}]: {}: {e}", case.id))?;
                }
                case.trajectories = g.trajectories.clone();
                out.push(case);
            }
        }
    }
    Ok(out)
}

fn to_case(p: &Point, suites: &[Suite], origin: &str) -> Result<Case, String> {
    let need = |v: Option<usize>, k: &str| v.ok_or_else(|| format!("`{k}` is not set"));
    let level = p.level.unwrap_or(Level::Logits);
    let knobs = Knobs {
        temperature: p.temperature.unwrap_or(1.0),
        epsilon_low: p.epsilon_low.unwrap_or(0.2),
        epsilon_high: p.epsilon_high.unwrap_or(0.2),
        beta: p.beta.unwrap_or(0.0),
        delta: p.delta.and_then(|m| m.0),
        loss_type: p.loss_type.unwrap_or(LossType::Grpo),
        max_completion_length: p.max_completion_length.and_then(|m| m.0),
        importance_sampling_level: p.importance_sampling_level.unwrap_or(IsLevel::Token),
        logits_dtype: p.logits_dtype.unwrap_or(LogitsDtype::F32),
    };
    let mut case = Case {
        id: String::new(),
        level,
        shape: Shape {
            b: need(p.b, "b")?,
            t: need(p.t, "t")?,
            v: need(p.v, "v")?,
            h: p.h,
        },
        dtype: p.dtype.unwrap_or(DType::F32),
        knobs,
        profile: p.profile.unwrap_or(DataProfile::Normal(1.0)),
        mask: p.mask.unwrap_or(MaskPattern::Random),
        advantages: p.advantages.unwrap_or(AdvPattern::Mixed),
        tier: p.tier.unwrap_or(TierName::Standard),
        compile_only: p.compile_only.unwrap_or(false),
        devices: p.devices.unwrap_or(1),
        sharding: p.sharding,
        suites: {
            let mut s = suites.to_vec();
            s.sort();
            s.dedup();
            s
        },
        origin: origin.to_string(),
        trajectories: Vec::new(),
    };
    case.id = case.make_id();
    case.validate().map_err(|e| format!("{}: {e}", case.id))?;
    Ok(case)
}

/// Sorts by id and merges repeats: the same id twice means the same computation, so
/// their suites are united; a repeat that differs (only the tier can) is an error.
fn merge(cases: Vec<Case>) -> Result<Matrix> {
    let mut by_id: BTreeMap<String, Case> = BTreeMap::new();
    for c in cases {
        match by_id.get_mut(&c.id) {
            None => {
                by_id.insert(c.id.clone(), c);
            }
            Some(prev) => {
                if prev.compile_only != c.compile_only {
                    bail!(
                        "case {} is defined twice, compile_only in one place only ({} and {})",
                        c.id,
                        prev.origin,
                        c.origin
                    );
                }
                if prev.tier != c.tier {
                    bail!(
                        "case {} is defined twice with different tiers ({} in {}, {} in {})",
                        c.id,
                        prev.tier,
                        prev.origin,
                        c.tier,
                        c.origin
                    );
                }
                prev.suites.extend(c.suites);
                prev.suites.sort();
                prev.suites.dedup();
                for t in c.trajectories {
                    if let Some(old) = prev.trajectories.iter().find(|x| x.label() == t.label()) {
                        if *old != t {
                            bail!(
                                "case {}: trajectory {} is defined twice, differently ({} and {})",
                                c.id,
                                t.label(),
                                prev.origin,
                                c.origin
                            );
                        }
                    } else {
                        prev.trajectories.push(t);
                    }
                }
            }
        }
    }
    Ok(Matrix {
        cases: by_id.into_values().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let yaml = "groups:\n  - name: g\n    suites: [ci]\n    product:\n      b: [1]\n      tempreture: [1.0]\n";
        let err = parse(yaml, "cases/x.yaml").unwrap_err().to_string();
        assert!(err.starts_with("cases/x.yaml: "), "{err}");
        assert!(err.contains("tempreture"), "{err}");
        assert!(err.contains("line 6"), "{err}");
    }

    #[test]
    fn product_zip_and_cases_multiply() {
        let yaml = "groups:\n  - name: g\n    suites: [ci]\n    fixed: {b: 1}\n    product: {dtype: [f32, bf16]}\n    zip: {t: [2, 3], v: [5, 7]}\n    cases: [{beta: 0.0}, {beta: 0.04}]\n";
        let cases = parse(yaml, "x").unwrap();
        assert_eq!(cases.len(), 2 * 2 * 2);
        assert!(cases.iter().any(|c| c.shape.t == 3
            && c.shape.v == 7
            && c.dtype == DType::Bf16
            && c.knobs.beta == 0.04));
        assert!(
            !cases.iter().any(|c| c.shape.t == 3 && c.shape.v == 5),
            "zip must pair, not multiply"
        );
    }

    #[test]
    fn zip_length_mismatch_and_overlap_are_errors() {
        let y1 = "groups:\n  - name: g\n    suites: [ci]\n    fixed: {b: 1}\n    zip: {t: [2, 3], v: [5]}\n";
        assert!(parse(y1, "x")
            .unwrap_err()
            .to_string()
            .contains("zip lists differ"));
        let y2 = "groups:\n  - name: g\n    suites: [ci]\n    fixed: {b: 1, t: 2}\n    product: {t: [2], v: [5]}\n";
        assert!(parse(y2, "x")
            .unwrap_err()
            .to_string()
            .contains("`t` is set in both"));
    }

    #[test]
    fn invalid_knob_is_an_error_naming_the_case() {
        let y =
            "groups:\n  - name: g\n    suites: [ci]\n    fixed: {b: 1, t: 2, v: 5, delta: 1.1}\n";
        let e = parse(y, "x").unwrap_err().to_string();
        assert!(e.contains("delta must be >"), "{e}");
        assert!(e.contains("group `g`"), "{e}");
    }

    #[test]
    fn unknown_suite_and_enum_values_are_errors() {
        let y = "groups:\n  - name: g\n    suites: [cii]\n    fixed: {b: 1, t: 2, v: 5}\n";
        assert!(parse(y, "x").is_err());
        let y = "groups:\n  - name: g\n    suites: [ci]\n    fixed: {b: 1, t: 2, v: 5, loss_type: grpoo}\n";
        let e = parse(y, "x").unwrap_err().to_string();
        assert!(
            e.contains("grpoo") && e.contains("dr_grpo") && e.contains("line 4"),
            "{e}"
        );
        let y = "groups:\n  - name: g\n    suites: [ci]\n    fixed: {b: 1, t: 2, v: 5}\n    product: {profile: [normal1, gauss]}\n";
        let e = parse(y, "x").unwrap_err().to_string();
        assert!(
            e.contains("unknown profile `gauss`") && e.contains("line 5"),
            "{e}"
        );
    }
}
