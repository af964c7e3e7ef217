//! `grpo-suite inputs <case> --out DIR`: a case as .npy files, reproducible in Python.

use anyhow::{Context, Result};
use grpo_conformance::cases::Case;
use grpo_conformance::inputs::HostData;
use grpo_conformance::npy;
use grpo_conformance::runner::Prepared;
use grpo_conformance::spec::Level;
use serde_json::json;
use std::path::Path;

/// Writes every input and the oracle's outputs (SPEC names) plus `case.json`, and hands
/// back the prepared case (its inputs and oracle) for a caller that writes more.
pub fn write(case: &Case, out: &Path) -> Result<Prepared> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    grpo_conformance::trials::check_host_memory(case)
        .map_err(|e| anyhow::anyhow!("{}: {e}", case.id))?;
    let p = Prepared::new(case);
    let (inputs, o) = (&p.inputs, &p.oracle);
    let mut files = serde_json::Map::new();
    let mut digests = serde_json::Map::new();
    for t in inputs.tensors(case) {
        let path = out.join(format!("{}.npy", t.name));
        match t.data {
            HostData::Float { values, .. } => npy::write_f32(&path, &t.shape, values)?,
            HostData::I32(values) => npy::write_i32(&path, &t.shape, values)?,
        }
        files.insert(t.name.into(), json!({"shape": t.shape, "dtype": t.dtype_name(), "stored_as": if t.dtype_name() == "i32" {"<i4"} else {"<f4"}}));
        digests.insert(t.name.into(), json!(t.digest()));
    }
    let s = case.shape;
    let bt = [s.b, s.t];
    let f = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<_>>();
    npy::write_f32(&out.join("loss.npy"), &[], &[o.loss as f32])?;
    npy::write_f32(&out.join("per_token_logp.npy"), &bt, &f(o.per_token_logp()))?;
    npy::write_f32(&out.join("per_token_loss.npy"), &bt, &f(&o.per_token_loss))?;
    npy::write_f32(&out.join("kl.npy"), &bt, &f(&o.kl))?;
    npy::write_f32(&out.join("entropy.npy"), &bt, &f(o.entropy()))?;
    npy::write_f32(
        &out.join("clipped.npy"),
        &bt,
        &o.clipped
            .iter()
            .map(|&c| c as u8 as f32)
            .collect::<Vec<_>>(),
    )?;
    let mut outputs = vec![
        "loss",
        "per_token_logp",
        "per_token_loss",
        "kl",
        "entropy",
        "clipped",
    ];
    // Tokens whose ratio lies within EDGE_BAND of a branch edge: either branch is right
    // there (the gates accept both), so the gradient of each branch is written.
    let band: Vec<f32> = o
        .g_alt
        .iter()
        .zip(&o.g)
        .map(|(a, &g)| f32::from(a.is_some_and(|a| a != g)))
        .collect();
    let other_branch = band.contains(&1.0);
    npy::write_f32(&out.join("edge_band.npy"), &bt, &band)?;
    let mut branch_files = vec!["edge_band"];
    match case.level {
        Level::Logits => {
            let dlogits = |w: &mut dyn std::io::Write, other: bool| -> std::io::Result<()> {
                let mut row = vec![0f32; s.v];
                for r in 0..s.rows() {
                    let g = if other {
                        o.g_alt[r].unwrap_or(o.g[r])
                    } else {
                        o.g[r]
                    };
                    o.dlogits_row(case, inputs, r, g, |j, x, _| row[j] = x as f32);
                    for x in &row {
                        w.write_all(&x.to_le_bytes())?;
                    }
                }
                Ok(())
            };
            npy::write_with(&out.join("dlogits.npy"), "<f4", &[s.b, s.t, s.v], |w| {
                dlogits(w, false)
            })?;
            outputs.push("dlogits");
            if other_branch {
                npy::write_with(
                    &out.join("dlogits_other_branch.npy"),
                    "<f4",
                    &[s.b, s.t, s.v],
                    |w| dlogits(w, true),
                )?;
                branch_files.push("dlogits_other_branch");
            }
        }
        Level::Fused => {
            let g = o.fused_grads(case, inputs);
            let h = s.h.unwrap_or(0);
            npy::write_f32(&out.join("dhidden.npy"), &[s.b, s.t, h], &f(&g.dhidden))?;
            npy::write_f32(&out.join("dlm_head.npy"), &[h, s.v], &f(&g.dlm_head))?;
            outputs.push("dhidden");
            outputs.push("dlm_head");
            if other_branch {
                // Every edge-band token on its other branch: row r's dlogits moves by
                // delta·u, its dhidden row by delta·a, dlm_head by delta·hidden[r] ⊗ u.
                let (mut dh, mut dw) = (g.dhidden.clone(), g.dlm_head.clone());
                for br in o.fused_branch_rows(case, inputs) {
                    let r = br.row;
                    for (x, a) in dh[r * h..(r + 1) * h].iter_mut().zip(&br.a) {
                        *x += br.delta * a;
                    }
                    for k in 0..h {
                        let hk = br.delta * inputs.hidden[r * h + k] as f64;
                        for (x, u) in dw[k * s.v..(k + 1) * s.v].iter_mut().zip(&br.u) {
                            *x += hk * u;
                        }
                    }
                }
                npy::write_f32(
                    &out.join("dhidden_other_branch.npy"),
                    &[s.b, s.t, h],
                    &f(&dh),
                )?;
                npy::write_f32(&out.join("dlm_head_other_branch.npy"), &[h, s.v], &f(&dw))?;
                branch_files.push("dhidden_other_branch");
                branch_files.push("dlm_head_other_branch");
            }
        }
    }
    let meta = json!({
        "case": case,
        "inputs": files,
        "input_digests": digests,
        "oracle_outputs": outputs,
        "edge_band": {"tokens": band.iter().filter(|&&x| x == 1.0).count(), "files": branch_files},
        "note": "floats are stored as f32; cast inputs to case.dtype (exact). Oracle outputs are the f64 oracle rounded to f32 (gradients not rounded to the input dtype). edge_band.npy marks the tokens whose ratio lies within 1e-4 of a branch edge (1 − ε_low, 1 + ε_high, δ): either branch is right there (the gates accept both); *_other_branch.npy, written when there are such tokens, hold the gradients with every one of them on the other branch (dlogits and dhidden rows: either file's row; dlm_head: a sum over tokens, so any mix of the two).",
        "oracle_version": grpo_conformance::oracle::ORACLE_VERSION,
        "generator_version": grpo_conformance::inputs::GENERATOR_VERSION,
    });
    grpo_conformance::atomic_file::replace(
        &out.join("case.json"),
        (serde_json::to_string_pretty(&meta)? + "\n").as_bytes(),
    )?;
    eprintln!(
        "wrote {} inputs and {} oracle outputs to {}",
        inputs.tensors(case).len(),
        outputs.len(),
        out.display()
    );
    Ok(p)
}
