//! dhidden and dlm_head against the oracle when some tokens sit at a branch edge.
//!
//! A token whose ratio lies within `oracle::EDGE_BAND` of a clip edge may legitimately take
//! either branch in an f32 kernel (the per-token `clipped` gate and the dlogits gate accept
//! either). At the fused level the branch moves that row's whole share of both gradients
//! ([`BranchRow`]): dlogits row r is g·u, so taking g_alt adds δ·a to dhidden row r and
//! δ·hidden[r] ⊗ u to dlm_head (δ = g_alt − g). At the seeds' 8192 tokens such rows are
//! routine (on an H200 one of them, row 4589, was 6.6e-3 of ‖dlm_head‖ = 0.67 alone).
//!
//! For each such row the gate compares the kernel with the oracle on whichever branch is
//! nearer: a dhidden row on its own; for dlm_head, the row's term is added when that
//! lowers ‖got − want‖ (its projection δ·hidden[r]ᵀ (got − want) u exceeds half its
//! squared norm; rows' terms are nearly orthogonal, so each is decided alone). Then the
//! usual bounds apply to the adjusted reference.

use super::Acc;
use crate::inputs::Inputs;
use crate::oracle::BranchRow;
use rayon::prelude::*;

/// dhidden ([rows, h]) against `want`, each branch row on its nearer branch; also the
/// number of rows judged on the other branch.
pub(super) fn dhidden(got: &[f32], want: &[f64], h: usize, rows: &[BranchRow]) -> (Acc, usize) {
    let mut shift: Vec<Option<&BranchRow>> = vec![None; want.len() / h.max(1)];
    for b in rows {
        let r = b.row;
        let (g, w) = (&got[r * h..(r + 1) * h], &want[r * h..(r + 1) * h]);
        let e0: f64 = g.iter().zip(w).map(|(&x, &y)| (x as f64 - y).powi(2)).sum();
        let e1: f64 = g
            .iter()
            .zip(w)
            .zip(&b.a)
            .map(|((&x, &y), &a)| (x as f64 - y - b.delta * a).powi(2))
            .sum();
        if e1 < e0 {
            shift[r] = Some(b);
        }
    }
    let moved = shift.iter().filter(|s| s.is_some()).count();
    let acc = got
        .par_chunks(h.max(1))
        .zip(want.par_chunks(h.max(1)))
        .enumerate()
        .map(|(r, (g, w))| {
            let mut acc = Acc::default();
            for (k, (&x, &y)) in g.iter().zip(w).enumerate() {
                let y = y + shift[r].map_or(0.0, |b| b.delta * b.a[k]);
                acc.add(r * h + k, x, y, 0.0, 0.0);
            }
            acc
        })
        .reduce(Acc::default, Acc::merge);
    (acc, moved)
}

/// dlm_head ([h, v]) against `want`, with the terms of the branch rows whose other branch
/// brings it nearer to `got`; also the number of such rows.
pub(super) fn dlm_head(
    got: &[f32],
    want: &[f64],
    h: usize,
    v: usize,
    inputs: &Inputs,
    rows: &[BranchRow],
) -> (Acc, usize) {
    let hid = |r: usize| &inputs.hidden[r * h..(r + 1) * h];
    let taken: Vec<&BranchRow> = rows
        .iter()
        .filter(|b| {
            let hr = hid(b.row);
            // hidden[r]ᵀ (got − want) u, over the rows of dlm_head in parallel.
            let proj: f64 = (0..h)
                .into_par_iter()
                .map(|k| {
                    let (g, w) = (&got[k * v..(k + 1) * v], &want[k * v..(k + 1) * v]);
                    let s: f64 = g
                        .iter()
                        .zip(w)
                        .zip(&b.u)
                        .map(|((&x, &y), &u)| (x as f64 - y) * u)
                        .sum();
                    hr[k] as f64 * s
                })
                .sum();
            let hn: f64 = hr.iter().map(|&x| (x as f64).powi(2)).sum();
            let un: f64 = b.u.iter().map(|x| x * x).sum();
            2.0 * b.delta * proj > b.delta * b.delta * hn * un
        })
        .collect();
    let acc = got
        .par_chunks(v.max(1))
        .zip(want.par_chunks(v.max(1)))
        .enumerate()
        .map(|(k, (g, w))| {
            let mut acc = Acc::default();
            for (j, (&x, &y)) in g.iter().zip(w).enumerate() {
                let y = y + taken
                    .iter()
                    .map(|b| b.delta * hid(b.row)[k] as f64 * b.u[j])
                    .sum::<f64>();
                acc.add(k * v + j, x, y, 0.0, 0.0);
            }
            acc
        })
        .reduce(Acc::default, Acc::merge);
    (acc, taken.len())
}

#[cfg(test)]
mod tests {
    use super::super::{judge, Acc, GateReport};
    use crate::cases::parse_fixed;
    use crate::inputs::Inputs;
    use crate::oracle::outputs::oracle_outputs;
    use crate::oracle::Oracle;
    use crate::outputs::Outputs;
    use crate::spec::OutputName;

    /// A fused case with one token placed on the upper clip edge (its old_logp set so that
    /// the ratio is 1 + ε_high to f32 rounding): the oracle offers its other branch.
    fn edge_case() -> (crate::cases::Case, Inputs, Oracle, usize) {
        let case =
            parse_fixed("level: fused, b: 2, t: 8, h: 64, v: 2049, advantages: positive").unwrap();
        let mut inputs = Inputs::generate(&case);
        let o = Oracle::new(&case, &inputs);
        let r = (0..case.shape.rows())
            .find(|&r| inputs.mask[r] != 0.0)
            .unwrap();
        inputs.old_logp[r] = (o.stats.logp[r] - (1.0 + case.knobs.epsilon_high).ln()) as f32;
        let o = Oracle::new(&case, &inputs);
        (case, inputs, o, r)
    }

    fn gates(
        case: &crate::cases::Case,
        inputs: &Inputs,
        o: &Oracle,
        out: &Outputs,
    ) -> Vec<GateReport> {
        judge(case, inputs, o, out)
            .into_iter()
            .filter(|g| matches!(g.output, OutputName::Dhidden | OutputName::DlmHead))
            .collect()
    }

    /// The oracle's outputs with `k`·δ of the edge row's other branch added to both
    /// gradients (k = 1: exactly the other branch).
    fn shifted(case: &crate::cases::Case, inputs: &Inputs, o: &Oracle, k: f64) -> Outputs {
        let (h, v) = (case.shape.h.unwrap(), case.shape.v);
        let b = &o.fused_branch_rows(case, inputs)[0];
        let mut out = oracle_outputs(case, inputs);
        let dh = out.tensors.get_mut(&OutputName::Dhidden).unwrap();
        for (x, a) in dh.data[b.row * h..(b.row + 1) * h].iter_mut().zip(&b.a) {
            *x += (k * b.delta * a) as f32;
        }
        let dw = out.tensors.get_mut(&OutputName::DlmHead).unwrap();
        for kk in 0..h {
            let hk = inputs.hidden[b.row * h + kk] as f64;
            for j in 0..v {
                dw.data[kk * v + j] += (k * b.delta * hk * b.u[j]) as f32;
            }
        }
        out
    }

    #[test]
    fn a_kernel_on_the_other_branch_of_an_edge_token_passes_and_beyond_it_fails() {
        let (case, inputs, o, r) = edge_case();
        let rows = o.fused_branch_rows(&case, &inputs);
        assert_eq!(rows.iter().map(|b| b.row).collect::<Vec<_>>(), vec![r]);
        // On this branch: passes, nothing moved.
        for g in gates(&case, &inputs, &o, &oracle_outputs(&case, &inputs)) {
            assert!(
                g.passed && !g.message.contains("other branch"),
                "{}",
                g.message
            );
        }
        // On the other branch: passes, and says so.
        let other = shifted(&case, &inputs, &o, 1.0);
        for g in gates(&case, &inputs, &o, &other) {
            assert!(
                g.passed
                    && g.message
                        .contains("1 of 1 token rows at a clip edge judged on their other branch"),
                "{}",
                g.message
            );
        }
        // The shift is far beyond the f32 bounds: judged plainly, the other branch fails.
        let fused = o.fused_grads(&case, &inputs);
        let tol = super::super::tiers::tolerance(case.tier, case.dtype, OutputName::DlmHead);
        let mut plain = Acc::default();
        let d = &other.tensors[&OutputName::DlmHead].data;
        for (i, (&x, &w)) in d.iter().zip(&fused.dlm_head).enumerate() {
            plain.add(i, x, w, 0.0, 0.0);
        }
        let shape = [case.shape.h.unwrap(), case.shape.v];
        assert!(
            !plain
                .report(OutputName::DlmHead, &shape, tol, "standard/f32".into())
                .passed
        );
        // Half-way, or past either branch: fails.
        for k in [0.5, 2.0, -1.0] {
            for g in gates(&case, &inputs, &o, &shifted(&case, &inputs, &o, k)) {
                assert!(!g.passed, "{k}·δ: {}", g.message);
            }
        }
    }
}
