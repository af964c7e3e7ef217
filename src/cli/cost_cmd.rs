//! `grpo-suite cost DIR`: the derived cost and roofline of one exported module (an artifact
//! directory of the exporter: `module.mlirbc` + `manifest.json`, e.g. under
//! `target/grpo-artifacts/`), compiled deviceless for each topology: where the HBM bytes
//! and MXU FLOPs go (the largest instructions, every loop's trip count, every Mosaic
//! kernel's derived and declared cost).

use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;

/// Arguments of `cost`.
#[derive(Debug, Args)]
pub struct CostArgs {
    /// An artifact directory (`module.mlirbc` and `manifest.json`).
    pub dir: PathBuf,
    /// A topology to compile for (repeatable; default v5e:2x2, v6e:2x2, tpu7x:2x2x1).
    #[arg(long = "topology")]
    pub topologies: Vec<String>,
    /// Print the derived cost as JSON (one object per topology) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Compiles and prints.
#[cfg(feature = "pjrt")]
pub fn run(args: CostArgs) -> Result<()> {
    use grpo_conformance::backends::pjrt::export::Manifest;
    use grpo_conformance::backends::pjrt::tpu_aot::{prepare_environment, TpuAot};
    use grpo_conformance::backends::pjrt::TpuAotConfig;
    use grpo_conformance::cost::roofline::roofline;
    prepare_environment();
    let manifest_path = args.dir.join("manifest.json");
    let text = std::fs::read_to_string(&manifest_path).with_context(|| {
        format!(
            "cannot read {} (give an artifact directory of the exporter)",
            manifest_path.display()
        )
    })?;
    let manifest: Manifest = serde_json::from_str(&text)
        .with_context(|| format!("{}: not an exporter manifest", manifest_path.display()))?;
    if manifest.platform != "tpu" {
        anyhow::bail!(
            "{}: exported for platform `{}`; the cost is derived for TPU exports",
            args.dir.display(),
            manifest.platform
        );
    }
    let module = args.dir.join("module.mlirbc");
    let topologies: Vec<String> = if args.topologies.is_empty() {
        super::sweep_cmd::DEFAULT_TOPOLOGIES
            .iter()
            .map(|s| s.to_string())
            .collect()
    } else {
        args.topologies.clone()
    };
    for t in &topologies {
        let cfg = TpuAotConfig {
            plugin: None,
            topologies: vec![t.clone()],
            implementations: vec![],
        };
        cfg.validate("grpo-suite cost")?;
        let b = TpuAot::new(&cfg, t)?;
        let res = b
            .compile_module(&module, &manifest)
            .with_context(|| format!("{t}"))?;
        let floor = res.memory.as_ref().and_then(|m| m.floor_bytes);
        let Some(mut d) = res.derived else {
            println!(
                "{t}: cost not derived: {}",
                res.cost_error.unwrap_or_default()
            );
            continue;
        };
        d.passes_over_floor = floor
            .filter(|&f| f > 0)
            .map(|f| d.work.hbm_bytes / f as f64);
        let r = b.generation().map(|g| roofline(&d, g));
        if args.json {
            println!(
                "{}",
                serde_json::json!({"topology": t, "derived": d, "roofline": r, "memory": res.memory})
            );
            continue;
        }
        println!(
            "{t}: {}",
            r.as_ref()
                .map_or("no published peaks for this generation".into(), |r| r
                    .describe(&d))
        );
        println!(
            "  MXU {:.4e} FLOP ({:.4e} bf16-pass weighted), other {:.4e} FLOP, {:.4e} transcendentals, HBM {:.4e} B{}",
            d.work.matmul_flops,
            d.work.matmul_pass_flops,
            d.work.other_flops,
            d.work.transcendentals,
            d.work.hbm_bytes,
            d.passes_over_floor.map(|p| format!(" = {p:.2}× the floor")).unwrap_or_default()
        );
        if let Some(m) = res.memory.as_ref().and_then(|m| m.peak_over_floor()) {
            println!("  peak HBM / floor {m:.3}");
        }
        for k in &d.kernels {
            println!(
                "  kernel {} ×{}: {:.4e} MXU FLOP, {:.4e} B{}",
                k.name,
                k.invocations,
                k.derived.matmul_flops,
                k.derived.hbm_bytes,
                k.mismatch
                    .as_ref()
                    .map(|m| format!("; {m}"))
                    .unwrap_or_default()
            );
        }
        for l in &d.loops {
            println!(
                "  loop {}: {} trips × {} executions",
                l.name,
                l.trips.map_or("?".into(), |x| x.to_string()),
                l.executions
            );
        }
        for c in &d.top {
            println!(
                "  {:>10.3} GB  {:>10.3e} FLOP  ×{:<6} {} ({})",
                c.hbm_bytes / 1e9,
                c.matmul_flops,
                c.executions,
                c.name,
                c.op
            );
        }
        for n in &d.notes {
            println!("  note: {n}");
        }
    }
    Ok(())
}

/// Without the `pjrt` feature there is no TPU compiler.
#[cfg(not(feature = "pjrt"))]
pub fn run(_args: CostArgs) -> Result<()> {
    anyhow::bail!("built without `pjrt` (the default feature): `cost` needs the TPU compiler")
}
