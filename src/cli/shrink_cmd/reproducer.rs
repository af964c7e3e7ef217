//! `shrink --out DIR`: the minimal case as a reproducer that needs no suite: its inputs
//! and the oracle's outputs (as `grpo-suite inputs` writes them), the implementation's
//! outputs (out_<name>.npy), case.json, config.yaml (the entry as configured),
//! request.json and gate.json (what reproduce.py runs and compares), reproduce.py and a
//! README.md with the commands and the one-line finding. reproduce.py is run once here, and
//! its output goes into the README as it printed.

use anyhow::{Context, Result};
use grpo_conformance::backends::NaiveF32;
use grpo_conformance::config::{Config, ImplConfig, ImplEntry};
use grpo_conformance::npy;
use grpo_conformance::runner::TrialOutcome;
use grpo_conformance::shrink::{Report, Signature};
use grpo_conformance::trials::{Trial, Work};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;

const SCRIPT: &str = include_str!("reproduce.py");

/// The family an executing backend runs: how reproduce.py calls the implementation.
enum Family {
    Jax,
    Torch,
    /// The suite's own Rust variants (`naive_f32+<Mutation>` on `reference`): no entry
    /// outside the suite runs them, so their outputs at the minimal case are written here
    /// (out_<name>.npy) and reproduce.py compares those with the oracle's.
    Suite(NaiveF32),
}

/// Writes the reproducer of `r`'s minimal case (whose outcome is `o`, failing as `sig`).
pub fn write(
    dir: &Path,
    r: &Report,
    t: &Trial,
    sig: &Signature,
    o: &TrialOutcome,
    config: &Config,
    config_path: &Path,
) -> Result<()> {
    let case = &r.minimal.case;
    let prepared = super::super::inputs_cmd::write(case, dir)?;
    let finding = format!(
        "`{}` fails at `{}`{}: {}",
        t.key.1,
        case.id,
        r.minimal
            .steps
            .map(|s| format!(" ({s} steps)"))
            .unwrap_or_default(),
        sig.figure(o)
    );
    let mut readme = format!(
        "# {}\n\nFound by `grpo-suite shrink` (configuration {}): {}.\n\n{finding}.\n\nShrunk from `{}` ({}).\n",
        t.name,
        config_path.display(),
        sig.describe(),
        r.start.describe(),
        r.start_figure
    );
    for b in &r.boundaries {
        readme.push_str(&format!("\n- Boundary: {}.", b.line()));
    }
    readme.push('\n');
    let entry = config
        .backends
        .implementations_on(&t.key.0)
        .iter()
        .find(|c| c.display_name() == t.key.1)
        .cloned();
    let family = match (&t.work, t.key.0.as_str()) {
        (Work::Run { .. }, b) if b.starts_with("torch-") => Some(Family::Torch),
        (Work::Run { .. }, b) if b.starts_with("pjrt-cpu") => Some(Family::Jax),
        (Work::Run { .. }, "reference") => NaiveF32::named(&t.key.1).map(Family::Suite),
        _ => None,
    };
    // The suite's own variants have no configured entry: theirs is their name.
    let entry = match (&family, entry) {
        (Some(Family::Suite(_)), None) => Some(ImplEntry::Id(t.key.1.clone()).resolved()),
        (_, e) => e,
    };
    let (Some(family), Some(entry), Signature::Gate { output, .. }) = (family, entry, sig) else {
        readme.push_str(&format!(
            "\nNo reproduce.py: it runs a configured JAX implementation on pjrt-cpu or a torch one (or compares the outputs of the suite's own naive_f32 variants), and compares a gate; this is `{}` on `{}`, failing as: {}. The inputs and the oracle's outputs are here (case.json).\n",
            t.key.1,
            t.key.0,
            sig.describe()
        ));
        std::fs::write(dir.join("README.md"), readme)?;
        eprintln!(
            "wrote the reproducer's inputs and README to {} (no script: see its README)",
            dir.display()
        );
        return Ok(());
    };
    let gate = o
        .gates
        .iter()
        .find(|g| g.output == *output)
        .context("the minimal case has no gate of its output")?;
    std::fs::write(
        dir.join("gate.json"),
        serde_json::to_string_pretty(&json!({
            "output": output.to_string(), "norm_err": gate.norm_err, "bound_used": gate.bound_used,
            "max_abs_err": gate.max_abs_err, "tier": gate.tier, "message": gate.message,
            "non_finite": gate.non_finite > 0,
        }))? + "\n",
    )?;
    let s = case.shape;
    let suite_own = matches!(family, Family::Suite(_));
    let (request, python, mut path, section) = match family {
        Family::Torch => (
            json!({"family": "torch", "request": {
                "impl": entry.id, "options": entry.options, "level": case.level,
                "b": s.b, "t": s.t, "v": s.v, "h": s.h, "dtype": case.dtype.name(),
                "knobs": case.knobs, "device": t.key.0.trim_start_matches("torch-"),
            }}),
            entry.python.clone().unwrap_or_else(|| {
                std::env::var_os("GRPO_TORCH_PYTHON")
                    .filter(|p| !p.is_empty())
                    .map(PathBuf::from)
                    .unwrap_or_else(|| {
                        grpo_conformance::repo_root().join(".venvs/torch/bin/python")
                    })
            }),
            vec![grpo_conformance::repo_root().join("backends/torch")],
            format!(
                "torch:\n    device: {}",
                t.key.0.trim_start_matches("torch-")
            ),
        ),
        Family::Jax => (
            json!({"family": "jax", "request": {
                "impl": entry.id, "level": case.level, "b": s.b, "t": s.t, "v": s.v, "h": s.h,
                "dtype": case.dtype.name(), "knobs": case.knobs, "impl_options": entry.options,
                "platform": "cpu", "emulates": "tpu",
            }}),
            entry.python.clone().unwrap_or_else(|| {
                grpo_conformance::env::python()
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| grpo_conformance::repo_root().join(".venv/bin/python"))
            }),
            vec![grpo_conformance::repo_root().join("backends/jax")],
            t.key.0.clone() + ":",
        ),
        Family::Suite(naive) => {
            // The inputs the suite's run judged (as the runner prepares them).
            let outs = naive.run(case, &prepared.inputs);
            for (name, x) in &outs.tensors {
                npy::write_f32(&dir.join(format!("out_{name}.npy")), &x.shape, &x.data)?;
            }
            (
                json!({"family": "suite", "implementation": t.key.1,
                       "outputs": outs.tensors.keys().map(|n| n.to_string()).collect::<Vec<_>>()}),
                grpo_conformance::env::python()
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| grpo_conformance::repo_root().join(".venv/bin/python")),
                Vec::new(),
                "reference:".to_string(),
            )
        }
    };
    // Absolute, symlinks kept (a venv's python is a link to its base interpreter).
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let python = if python.components().count() > 1 {
        absolute(&python)
    } else {
        python
    };
    let mut pythonpath: Vec<PathBuf> = entry.pythonpath.iter().map(|p| absolute(p)).collect();
    pythonpath.append(&mut path);
    std::fs::write(
        dir.join("request.json"),
        serde_json::to_string_pretty(&request)? + "\n",
    )?;
    std::fs::write(
        dir.join("config.yaml"),
        config_yaml(&section, &entry, &python, &pythonpath)?,
    )?;
    std::fs::write(dir.join("reproduce.py"), SCRIPT)?;
    let joined = std::env::join_paths(&pythonpath)?
        .to_string_lossy()
        .into_owned();
    let command = if joined.is_empty() {
        format!("{} reproduce.py", python.display())
    } else {
        format!("PYTHONPATH={joined} {} reproduce.py", python.display())
    };
    let ran = Command::new(&python)
        .arg(dir.join("reproduce.py"))
        .env("PYTHONPATH", &joined)
        .env("JAX_PLATFORMS", "cpu")
        .output()
        .with_context(|| format!("cannot run {}", python.display()))?;
    let printed = String::from_utf8_lossy(&ran.stdout).trim().to_string();
    let code = ran.status.code().unwrap_or(-1);
    readme.push_str(&format!(
        "\n## Reproduce\n\nIn this directory (numpy and the implementation's own environment; no suite):\n\n```sh\n{command}\n```\n\n{runs}, and prints the output's worst element with both values, its relative norm error and its non-finite count beside the suite's gate line (gate.json); exit 1 when the failure reproduces. Set whatever environment the implementation itself reads (an example's README says, e.g. MLLM_JAX_DIR). As it printed when written (exit {code}):\n\n```\n{printed}\n```\n",
        runs = if suite_own {
            format!("`{}` is the suite's own Rust code, which nothing outside the suite runs: the outputs it gave on the inputs here are out_<name>.npy (request.json names them); it compares those with the oracle's", entry.display_name())
        } else {
            format!("It runs `{}` through the same entry as the configuration (config.yaml, request.json) on the inputs here, writes its outputs as out_<name>.npy", entry.display_name())
        }
    ));
    std::fs::write(dir.join("README.md"), readme)?;
    let reproduces = code == 1 && printed.contains("FAIL: the failure reproduces");
    if reproduces {
        eprintln!(
            "wrote the reproducer to {}: reproduce.py alone prints the failure ({})",
            dir.display(),
            printed
                .lines()
                .find(|l| l.starts_with(&format!("{output}:")))
                .unwrap_or_default()
        );
    } else {
        let err = String::from_utf8_lossy(&ran.stderr);
        eprintln!(
            "warning: wrote the reproducer to {}, but reproduce.py alone does not show the failure (exit {code}): {}{}",
            dir.display(),
            printed.lines().last().unwrap_or_default(),
            err.lines().last().map(|l| format!(" {l}")).unwrap_or_default()
        );
    }
    Ok(())
}

/// The entry as configured, its paths absolute.
fn config_yaml(
    section: &str,
    e: &ImplConfig,
    python: &Path,
    pythonpath: &[PathBuf],
) -> Result<String> {
    let entry = json!({
        "id": e.id, "name": e.display_name(), "options": e.options,
        "python": python, "pythonpath": pythonpath,
    });
    Ok(format!(
        "# The implementation's entry as the shrunk run configured it (paths absolute).\nbackends:\n  {section}\n    implementations:\n      - {}\n",
        serde_json::to_string(&entry)?
    ))
}
