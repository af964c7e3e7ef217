//! Golden files: per-case f32 digests of the oracle, with provenance, in `golden/`.
//!
//! They catch drift of the oracle or of the input generator: `golden check` re-derives
//! every value now and compares with what is stored. Big cases stay small on disk: norms
//! and a few sampled gradient values instead of tensors.

use crate::cases::Case;
use crate::inputs::{rng, Inputs, GENERATOR_VERSION};
use crate::oracle::{Oracle, ORACLE_VERSION};
use crate::spec::Level;
use anyhow::Result;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Per-token vectors are stored when B·T is at most this.
pub const MAX_STORED_TOKENS: usize = 256;
/// Sampled positions of each big gradient.
pub const SAMPLES: usize = 32;
/// Environment variable that makes tests rewrite golden files instead of checking them.
pub const BLESS_ENV: &str = "GRPO_BLESS";
/// How to fix a mismatch, printed with every diff.
pub const BLESS_HINT: &str =
    "if the change is intended, re-bless: `cargo run --release -- golden update` (or GRPO_BLESS=1 cargo test)";

/// Versions and digests that produced a golden file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// [`ORACLE_VERSION`] at bless time.
    pub oracle_version: u32,
    /// [`GENERATOR_VERSION`] at bless time. A file of an earlier version is current when
    /// its input digests are today's (the rules changed other cases only).
    pub generator_version: u32,
    /// Crate version at bless time (informational).
    pub suite_version: String,
}

/// One golden file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Golden {
    /// Case id.
    pub case: String,
    /// Versions.
    pub provenance: Provenance,
    /// Digest of every input tensor.
    pub inputs: BTreeMap<String, String>,
    /// Scalar loss.
    pub loss: f32,
    /// Number of clipped tokens where mask = 1.
    pub clipped_count: usize,
    /// L2 norm of every output.
    pub norms: BTreeMap<String, f32>,
    /// Per-token vectors (small cases only).
    pub per_token: BTreeMap<String, Vec<f32>>,
    /// Sampled values of each gradient: (flat index, value).
    pub samples: BTreeMap<String, Vec<(usize, f32)>>,
}

/// Where the golden file of `case` lives under `dir`.
pub fn path(dir: &Path, case: &Case) -> PathBuf {
    dir.join(format!("{}.json", case.data_id()))
}

fn sample_positions(case: &Case, n: usize) -> Vec<usize> {
    let s = rng::Stream::new(case.data_id(), "golden_samples");
    let mut p: Vec<usize> = (0..SAMPLES as u64)
        .map(|i| s.below(i, n as u64) as usize)
        .collect();
    p.push(0);
    p.push(n - 1);
    p.sort_unstable();
    p.dedup();
    p
}

/// Computes the golden record of a case from its inputs and oracle.
pub fn compute(case: &Case, inputs: &Inputs, o: &Oracle) -> Golden {
    let l2 = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt() as f32;
    let masked = |v: &[f64]| {
        v.iter()
            .zip(&inputs.mask)
            .map(|(x, m)| x * (*m as f64))
            .collect::<Vec<_>>()
    };
    let mut norms = BTreeMap::new();
    norms.insert("per_token_logp".into(), l2(o.per_token_logp()));
    norms.insert("entropy".into(), l2(o.entropy()));
    norms.insert("per_token_loss".into(), l2(&masked(&o.per_token_loss)));
    norms.insert("kl".into(), l2(&masked(&o.kl)));
    let mut samples = BTreeMap::new();
    match case.level {
        Level::Logits => {
            let v = case.shape.v;
            let sq: f64 = (0..case.shape.rows())
                .into_par_iter()
                .map(|r| {
                    let mut s = 0.0;
                    o.dlogits_row(case, inputs, r, o.g[r], |_, x, _| s += x * x);
                    s
                })
                .collect::<Vec<f64>>()
                .iter()
                .sum();
            norms.insert("dlogits".into(), sq.sqrt() as f32);
            let pos = sample_positions(case, case.shape.rows() * v);
            let vals = pos
                .iter()
                .map(|&p| {
                    let (r, j) = (p / v, p % v);
                    let mut val = 0.0;
                    o.dlogits_row(case, inputs, r, o.g[r], |k, x, _| {
                        if k == j {
                            val = x
                        }
                    });
                    (p, val as f32)
                })
                .collect();
            samples.insert("dlogits".into(), vals);
        }
        Level::Fused => {
            let g = o.fused_grads(case, inputs);
            for (name, t) in [("dhidden", &g.dhidden), ("dlm_head", &g.dlm_head)] {
                norms.insert(name.into(), l2(t));
                let vals = sample_positions(case, t.len())
                    .iter()
                    .map(|&p| (p, t[p] as f32))
                    .collect();
                samples.insert(name.into(), vals);
            }
        }
    }
    let mut per_token = BTreeMap::new();
    if case.shape.rows() <= MAX_STORED_TOKENS {
        let f = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
        per_token.insert("per_token_logp".into(), f(o.per_token_logp()));
        per_token.insert("entropy".into(), f(o.entropy()));
        per_token.insert("per_token_loss".into(), f(&masked(&o.per_token_loss)));
        per_token.insert("kl".into(), f(&masked(&o.kl)));
    }
    Golden {
        case: case.data_id().to_string(),
        provenance: Provenance {
            oracle_version: ORACLE_VERSION,
            generator_version: GENERATOR_VERSION,
            suite_version: env!("CARGO_PKG_VERSION").into(),
        },
        inputs: inputs
            .tensors(case)
            .iter()
            .map(|t| (t.name.to_string(), t.digest()))
            .collect(),
        loss: o.loss as f32,
        clipped_count: o
            .clipped
            .iter()
            .zip(&inputs.mask)
            .filter(|(c, m)| **c && **m != 0.0)
            .count(),
        norms,
        per_token,
        samples,
    }
}

/// Reads a golden file whatever its versions: `Ok(None)` when it does not exist; a corrupt
/// file is an error saying so.
pub fn read(path: &Path) -> Result<Option<Golden>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => anyhow::bail!("{}: cannot read golden file: {e}", path.display()),
    };
    serde_json::from_slice(&bytes).map(Some).map_err(|e| {
        anyhow::anyhow!(
            "{}: corrupt golden file ({e}); {BLESS_HINT}",
            path.display()
        )
    })
}

/// Reads a golden file; a missing, corrupt or stale file is an error saying so and how
/// to fix it.
pub fn load(path: &Path) -> Result<Golden> {
    let Some(g) = read(path)? else {
        anyhow::bail!("{}: missing golden file; {BLESS_HINT}", path.display())
    };
    // An earlier generator's file stays current for a case whose inputs the rules since
    // did not change: `check` compares the stored input digests with today's (a changed
    // input is "generator drift"), and the oracle's outputs follow from the inputs.
    if g.provenance.oracle_version != ORACLE_VERSION
        || g.provenance.generator_version > GENERATOR_VERSION
    {
        anyhow::bail!(
            "{}: stale golden file (oracle v{}, generator v{}; now v{ORACLE_VERSION}, v{GENERATOR_VERSION}); {BLESS_HINT}",
            path.display(),
            g.provenance.oracle_version,
            g.provenance.generator_version
        );
    }
    Ok(g)
}

/// Writes a golden file (pretty JSON, directories created).
pub fn store(path: &Path, g: &Golden) -> Result<()> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let mut text = serde_json::to_string_pretty(g)?;
    text.push('\n');
    crate::atomic_file::replace(path, text.as_bytes())
}

/// Two f32 agree to within 4 units in the last place (or both below f32's normal range),
/// which absorbs f64 summation-order and libm differences between machines.
///
/// ```
/// use grpo_conformance::golden::close;
/// assert!(close(1.0, 1.0 + 4.0 * f32::EPSILON));
/// assert!(!close(1.0, 1.0 + 8.0 * f32::EPSILON));
/// assert!(!close(f32::NAN, f32::NAN));
/// ```
pub fn close(a: f32, b: f32) -> bool {
    if a == b {
        return true;
    }
    if !a.is_finite() || !b.is_finite() {
        return false;
    }
    let m = a.abs().max(b.abs());
    if m < f32::MIN_POSITIVE {
        return true;
    }
    let ulp = f32::from_bits(m.to_bits() + 1) - m;
    (a - b).abs() <= 4.0 * ulp
}

/// Differences between a stored and a re-derived golden record, one line each.
pub fn diff(stored: &Golden, now: &Golden) -> Vec<String> {
    let mut d = Vec::new();
    if stored.case != now.case {
        d.push(format!("case: stored {}, now {}", stored.case, now.case));
    }
    for (k, v) in &now.inputs {
        match stored.inputs.get(k) {
            Some(s) if s == v => {}
            s => d.push(format!(
                "input {k}: stored {}, now {v} (generator drift)",
                s.map_or("none", |s| s.as_str())
            )),
        }
    }
    if !close(stored.loss, now.loss) {
        d.push(format!(
            "loss: stored {:e}, now {:e}",
            stored.loss, now.loss
        ));
    }
    if stored.clipped_count != now.clipped_count {
        d.push(format!(
            "clipped_count: stored {}, now {}",
            stored.clipped_count, now.clipped_count
        ));
    }
    for (k, v) in &now.norms {
        match stored.norms.get(k) {
            Some(s) if close(*s, *v) => {}
            s => d.push(format!("norm {k}: stored {s:?}, now {v:e}")),
        }
    }
    for (k, v) in &now.per_token {
        match stored.per_token.get(k) {
            None => d.push(format!("per_token {k}: missing in stored file")),
            Some(s) if s.len() != v.len() => d.push(format!(
                "per_token {k}: stored {} values, now {}",
                s.len(),
                v.len()
            )),
            Some(s) => {
                if let Some(first) = (0..v.len()).find(|&i| !close(s[i], v[i])) {
                    let (mut d2, mut s2, mut worst) = (0f64, 0f64, first);
                    for i in 0..v.len() {
                        let e = (v[i] as f64 - s[i] as f64).abs();
                        d2 += e * e;
                        s2 += (s[i] as f64).powi(2);
                        if e > (v[worst] as f64 - s[worst] as f64).abs() {
                            worst = i;
                        }
                    }
                    let n = (0..v.len()).filter(|&i| !close(s[i], v[i])).count();
                    d.push(format!(
                        "per_token {k}: {n} of {} values differ, ‖Δ‖/‖stored‖ = {:.2e}, worst [{worst}]: stored {:e}, now {:e}",
                        v.len(),
                        d2.sqrt() / s2.sqrt().max(f64::MIN_POSITIVE),
                        s[worst],
                        v[worst]
                    ));
                }
            }
        }
    }
    for (k, v) in &now.samples {
        match stored.samples.get(k) {
            Some(s) if s.len() == v.len() => {
                if let Some(i) = (0..v.len()).find(|&i| s[i].0 != v[i].0 || !close(s[i].1, v[i].1))
                {
                    d.push(format!(
                        "sample {k}@{}: stored {:e}, now {:e}",
                        v[i].0, s[i].1, v[i].1
                    ));
                }
            }
            _ => d.push(format!("samples {k}: positions differ")),
        }
    }
    d
}

/// Outcome of checking one case against its golden file.
#[derive(Debug)]
pub enum Check {
    /// Stored and re-derived agree.
    Match,
    /// They differ: one line per difference.
    Mismatch(Vec<String>),
}

/// Re-derives the golden record of `case` and compares with the file under `dir`.
pub fn check(dir: &Path, case: &Case, inputs: &Inputs, o: &Oracle) -> Result<Check> {
    let stored = load(&path(dir, case))?;
    let d = diff(&stored, &compute(case, inputs, o));
    Ok(if d.is_empty() {
        Check::Match
    } else {
        Check::Mismatch(d)
    })
}

/// Golden files under `dir` that belong to no case of `cases` (stale leftovers).
pub fn orphans(dir: &Path, cases: &[&Case]) -> Vec<PathBuf> {
    let known: std::collections::HashSet<PathBuf> = cases.iter().map(|c| path(dir, c)).collect();
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "json") && !known.contains(&p) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod version_tests {
    use super::*;
    use crate::runner::Prepared;

    /// A file of an earlier generator is current while its input digests are today's;
    /// a moved input is generator drift; a file of a newer generator is refused.
    #[test]
    fn an_earlier_generators_file_is_current_while_its_inputs_are() {
        let case =
            crate::cases::parse_fixed("b: 2, t: 4, v: 37, beta: 0.04, mask: right_pad").unwrap();
        let p = Prepared::new(&case);
        let dir = tempfile::tempdir().unwrap();
        let mut g = compute(&case, &p.inputs, &p.oracle);
        g.provenance.generator_version = GENERATOR_VERSION - 1;
        store(&path(dir.path(), &case), &g).unwrap();
        assert!(matches!(
            check(dir.path(), &case, &p.inputs, &p.oracle).unwrap(),
            Check::Match
        ));
        g.inputs
            .insert("mask".into(), "xxh3:0000000000000000".into());
        store(&path(dir.path(), &case), &g).unwrap();
        match check(dir.path(), &case, &p.inputs, &p.oracle).unwrap() {
            Check::Mismatch(d) => assert!(d.iter().any(|l| l.contains("generator drift")), "{d:?}"),
            Check::Match => panic!("a moved input matched"),
        }
        g.provenance.generator_version = GENERATOR_VERSION + 1;
        store(&path(dir.path(), &case), &g).unwrap();
        let e = check(dir.path(), &case, &p.inputs, &p.oracle).unwrap_err();
        assert!(e.to_string().contains("stale golden file"), "{e}");
    }
}
