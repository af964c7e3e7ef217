//! `grpo-suite sweep`: for one implementation and one case (an id, or a shape given on the
//! command line), compile every option set of a search space deviceless on each topology
//! and print what a kernel author wants before booking a TPU: compiles or the compiler's
//! error, peak/floor, logits-sized matmuls, HBM bytes, roofline time and its ratio to
//! jax_baseline's, and the best option set within the budgets (`--write-config` pins it).
//! Rows are written to a JSONL record as they finish (`report` plots them).

use anyhow::{bail, Context, Result};
use clap::Args;
use grpo_conformance::cases::{Case, Matrix};
use grpo_conformance::config::Config;
use grpo_conformance::sweep::{self, Budgets, Space, SpeedBudget};
use serde_json::{Map, Value};
use std::path::PathBuf;

/// The generations `sweep` compiles for by default (one topology each).
pub const DEFAULT_TOPOLOGIES: [&str; 3] = ["v5e:2x2", "v6e:2x2", "tpu7x:2x2x1"];

/// Arguments of `sweep`.
#[derive(Debug, Args)]
pub struct SweepArgs {
    /// The implementation (an id of grpo_jax, or `module:attribute` with --pythonpath).
    #[arg(long = "impl")]
    pub implementation: String,
    /// A case id of the matrix (`grpo-suite cases --suite full`).
    #[arg(long, conflicts_with = "shape")]
    pub case: Option<String>,
    /// An ad-hoc case, as a case file's `fixed:` mapping, e.g.
    /// "level: fused, b: 1, t: 8192, h: 4096, v: 151936, dtype: bf16, beta: 0.04".
    #[arg(long)]
    pub shape: Option<String>,
    /// A topology to compile for (repeatable; default v5e:2x2, v6e:2x2, tpu7x:2x2x1).
    #[arg(long = "topology")]
    pub topologies: Vec<String>,
    /// A dimension of the search space, `option=v1,v2,...` (repeatable; default: the
    /// implementation's declared `search_space`).
    #[arg(long = "space")]
    pub space: Vec<String>,
    /// An option fixed for every set, `option=value` (repeatable).
    #[arg(long = "set")]
    pub set: Vec<String>,
    /// Memory budget (default: the implementation's tpu-aot entry in the configuration).
    #[arg(long, allow_negative_numbers = true, value_parser = super::numbers::ratio_at_least_one)]
    pub max_peak_over_floor: Option<f64>,
    /// Speed budget against the class baseline's roofline (default: the configured
    /// entry's).
    #[arg(long, allow_negative_numbers = true, value_parser = super::numbers::positive)]
    pub max_roofline_over_baseline: Option<f64>,
    /// The precision class the option sets must reach (f32, bf16x3 or bf16; tf32 is
    /// refused, no TPU computes it; default: the configured entry's `min_precision_class`,
    /// else by the case's dtype): the speed is compared with that class's jax_baseline, and
    /// a set below it is OUT OF CLASS (docs/spec.md, "Precision classes").
    #[arg(long, value_parser = parse_class)]
    pub precision_class: Option<grpo_conformance::precision_class::PrecisionClass>,
    /// Where the exporter imports a `module:attribute` implementation from.
    #[arg(long)]
    pub pythonpath: Vec<PathBuf>,
    /// Write the best option set (within budgets on every topology) as a configuration
    /// entry to this file.
    #[arg(long)]
    pub write_config: Option<PathBuf>,
    /// Let --write-config replace an existing file.
    #[arg(long)]
    pub force: bool,
    /// JSONL record file (default: records/sweep-<implementation>-<time>.jsonl).
    #[arg(long)]
    pub records: Option<PathBuf>,
    /// Configuration the budgets and the libtpu plugin come from (default as for `run`).
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// The case a sweep compiles: `--case` from the matrix or `--shape` (compile-only).
pub fn sweep_case(matrix: &Matrix, args: &SweepArgs) -> Result<Case> {
    match (&args.case, &args.shape) {
        (Some(id), None) => matrix
            .get(id)
            .cloned()
            .with_context(|| format!("no case `{id}` in the matrix (list them with `grpo-suite cases --suite full`, or give --shape)")),
        (None, Some(shape)) => {
            let text = if shape.contains("compile_only") { shape.clone() } else { format!("{shape}, compile_only: true") };
            grpo_conformance::cases::parse_fixed(&text).map_err(|e| anyhow::anyhow!("--shape \"{shape}\": {e:#}"))
        }
        _ => bail!("give the case to sweep: --case <case id> or --shape \"level: fused, b: 1, t: 8192, h: 4096, v: 151936, dtype: bf16\""),
    }
}

fn parse_class(s: &str) -> Result<grpo_conformance::precision_class::PrecisionClass, String> {
    grpo_conformance::precision_class::PrecisionClass::parse(s)
}

/// The budgets: the command line's, else the first tpu-aot entry of the configuration
/// with the implementation's id.
pub fn budgets(config: &Config, args: &SweepArgs) -> Budgets {
    let tpu_aot = config
        .backends
        .get::<grpo_conformance::backends::pjrt::TpuAotConfig>("tpu-aot");
    let entry = tpu_aot.and_then(|t| {
        t.implementations
            .iter()
            .map(|e| e.resolved())
            .find(|c| c.id == args.implementation)
    });
    Budgets {
        max_peak_over_floor: args
            .max_peak_over_floor
            .or(entry.as_ref().and_then(|e| e.max_peak_over_floor)),
        peak_slack_bytes: entry.as_ref().map_or(0, |e| e.peak_slack_bytes),
        max_roofline_over_baseline: args
            .max_roofline_over_baseline
            .map(SpeedBudget::All)
            .or(entry
                .as_ref()
                .and_then(|e| e.max_roofline_over_baseline.clone())),
        min_precision_class: args
            .precision_class
            .map(grpo_conformance::precision_class::ClassRule::All)
            .or(entry.as_ref().and_then(|e| e.min_precision_class.clone())),
    }
}

/// The search space from `--space` arguments, or the implementation's declared one.
pub fn space_of(args: &SweepArgs, declared: Option<&Map<String, Value>>) -> Result<Space> {
    if !args.space.is_empty() {
        return args
            .space
            .iter()
            .map(|a| sweep::parse_assignment(a).map_err(anyhow::Error::msg))
            .collect();
    }
    let declared = declared.filter(|d| !d.is_empty()).with_context(|| {
        format!(
            "`{}` declares no search space: give one with --space option=v1,v2 (repeatable)",
            args.implementation
        )
    })?;
    declared
        .iter()
        .map(|(k, v)| match v {
            Value::Array(a) => Ok((k.clone(), a.clone())),
            other => bail!(
                "`{}`'s search space for `{k}` is not a list: {other}",
                args.implementation
            ),
        })
        .collect()
}

/// Runs the sweep.
#[cfg(feature = "pjrt")]
pub fn run(matrix: &Matrix, args: SweepArgs) -> Result<()> {
    imp::run(matrix, args)
}

/// Without the `pjrt` feature there is no TPU compiler.
#[cfg(not(feature = "pjrt"))]
pub fn run(_matrix: &Matrix, _args: SweepArgs) -> Result<()> {
    bail!("built without `pjrt` (the default feature): `sweep` needs the TPU compiler")
}

#[cfg(feature = "pjrt")]
mod imp {
    use super::*;
    use grpo_conformance::backends::pjrt::tpu_aot::{prepare_environment, TpuAot};
    use grpo_conformance::backends::pjrt::TpuAotConfig;
    use grpo_conformance::backends::{Backend, RunOptions};
    use grpo_conformance::config::{ImplConfig, ImplEntry};
    use grpo_conformance::cost::roofline::human_time;
    use grpo_conformance::cost::speed::BASELINE;
    use grpo_conformance::records::RecordWriter;
    use grpo_conformance::runner::{run_trial, TrialKind, TrialOutcome, Verdict};
    use indicatif::{ProgressBar, ProgressStyle};
    use std::collections::BTreeMap;

    /// The most VMEM a kernel may ask for (v5e and v6e have 128 MiB; tpu7x 64 MiB per
    /// core, where the compiler then says so).
    const VMEM_MAX: u64 = 128 * 1024 * 1024;

    fn entry(
        id: &str,
        name: &str,
        options: &Map<String, Value>,
        b: &Budgets,
        pythonpath: &[PathBuf],
    ) -> ImplConfig {
        let mut c = ImplEntry::Id(id.to_string()).resolved();
        c.name = Some(name.to_string());
        c.options = options.clone();
        c.max_peak_over_floor = b.max_peak_over_floor;
        c.peak_slack_bytes = if b.max_peak_over_floor.is_some() {
            b.peak_slack_bytes
        } else {
            0
        };
        c.max_roofline_over_baseline = b.max_roofline_over_baseline.clone();
        c.min_precision_class = b.min_precision_class.clone();
        c.pythonpath = pythonpath.to_vec();
        c
    }

    fn backend(plugin: Option<&PathBuf>, topology: &str, entries: &[ImplConfig]) -> Result<TpuAot> {
        let cfg = TpuAotConfig {
            plugin: plugin.cloned(),
            topologies: vec![topology.to_string()],
            implementations: entries.iter().cloned().map(ImplEntry::Full).collect(),
        };
        cfg.validate("grpo-suite sweep")?;
        TpuAot::new(&cfg, topology)
    }

    pub fn run(matrix: &Matrix, args: SweepArgs) -> Result<()> {
        // Before minutes of compiles: a configuration file is not replaced by a fragment.
        if let Some(path) = args
            .write_config
            .as_ref()
            .filter(|p| p.exists() && !args.force)
        {
            bail!(
                "--write-config {}: the file exists (it would be replaced by one configuration entry); name a new file, or pass --force",
                path.display()
            );
        }
        prepare_environment();
        let config_path = Config::path_for(
            args.config.as_deref(),
            grpo_conformance::cases::Suite::Nightly,
        )?;
        let config = Config::load(&config_path)?;
        grpo_conformance::backends::pjrt::export::set_timeout(config.export_timeout_s);
        let case = sweep_case(matrix, &args)?;
        let budgets = budgets(&config, &args);
        // The class the speed is compared within, and its baseline (one per sweep).
        let class = grpo_conformance::precision_class::required(
            budgets.min_precision_class.as_ref(),
            config.min_precision_class.as_ref(),
            case.dtype,
        );
        if !sweep::tpu_computes(class) {
            bail!(
                "class {class}: no TPU computes it (a TPU's matmuls are bf16 passes or f32; docs/spec.md, \"Precision classes\"): sweep within f32, bf16x3 or bf16"
            );
        }
        let dz = class.baseline_dz_precision();
        let mut base_entry = ImplEntry::Id(BASELINE.into()).resolved();
        if dz != "default" {
            base_entry.name = Some(format!("{BASELINE}@{dz}"));
            base_entry.options.insert("dz_precision".into(), dz.into());
        }
        let base_name = base_entry.display_name().to_string();
        let plugin = config
            .backends
            .get::<grpo_conformance::backends::pjrt::TpuAotConfig>("tpu-aot")
            .and_then(|t| t.plugin.clone());
        let topologies: Vec<String> = if args.topologies.is_empty() {
            DEFAULT_TOPOLOGIES.iter().map(|s| s.to_string()).collect()
        } else {
            args.topologies.clone()
        };
        let pythonpath: Vec<PathBuf> = args
            .pythonpath
            .iter()
            .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone()))
            .collect();
        // The search space, and every option set of it.
        let probe = backend(plugin.as_ref(), &topologies[0], &[])?;
        let declared = if args.implementation.contains(':') {
            None
        } else {
            let impls = probe.exporter().list_impls()?;
            let info = impls.into_iter().find(|i| i.id == args.implementation).with_context(|| format!("no implementation `{}` in grpo_jax (see `python -m grpo_jax.export --list-impls`)", args.implementation))?;
            Some(info)
        };
        let space = space_of(&args, declared.as_ref().map(|i| &i.search_space))?;
        let mut fixed = Map::new();
        for s in &args.set {
            let (k, mut v) = sweep::parse_assignment(s).map_err(anyhow::Error::msg)?;
            if v.len() != 1 {
                bail!("--set {s}: one value only (use --space for several)");
            }
            fixed.insert(k, v.remove(0));
        }
        let keys: Vec<String> = space.iter().map(|(k, _)| k.clone()).collect();
        let sets = sweep::option_sets(&space, &fixed);
        let mut entries: Vec<ImplConfig> = sets
            .iter()
            .map(|s| {
                entry(
                    &args.implementation,
                    &sweep::entry_name(&args.implementation, s, &keys),
                    s,
                    &budgets,
                    &pythonpath,
                )
            })
            .collect();
        // Option sets the kernel refuses for its VMEM estimate are tried again with the
        // largest VMEM limit: the compiler then says whether they fit.
        let raises_vmem = declared
            .as_ref()
            .is_some_and(|i| i.default_options.contains_key("vmem_limit_bytes"));
        let base = backend(plugin.as_ref(), &topologies[0], &entries)?;
        base.validate()?;
        let work: Vec<(&str, &Case)> = entries.iter().map(|e| (e.display_name(), &case)).collect();
        eprintln!(
            "sweep: exporting {} option sets of `{}` for {}",
            entries.len(),
            args.implementation,
            case.id
        );
        base.prepare(&work)?;
        if raises_vmem {
            let mut raised = Vec::new();
            for (e, s) in entries.iter().zip(&sets) {
                if let Err(r) = base.supports(e.display_name(), &case) {
                    if r.to_string().contains("VMEM") && !s.contains_key("vmem_limit_bytes") {
                        let mut s2 = s.clone();
                        s2.insert("vmem_limit_bytes".into(), VMEM_MAX.into());
                        raised.push(entry(
                            &args.implementation,
                            &sweep::entry_name(&args.implementation, &s2, &keys),
                            &s2,
                            &budgets,
                            &pythonpath,
                        ));
                    }
                }
            }
            entries.extend(raised);
        }
        let records_path = args.records.clone().unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            grpo_conformance::repo_root().join(format!(
                "records/sweep-{}-{t}.jsonl",
                args.implementation.replace([':', '/'], "_")
            ))
        });
        let mut writer = RecordWriter::open(&records_path)?;
        let pb = ProgressBar::new((topologies.len() * (entries.len() + 1)) as u64);
        pb.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} compiles {elapsed_precise} {msg}")
                .unwrap(),
        );
        let opts = RunOptions {
            warmup: 0,
            repeats: 0,
        };
        let mut rows: Vec<(String, TrialOutcome)> = Vec::new();
        let mut baselines: BTreeMap<String, f64> = BTreeMap::new();
        let mut baseline_rows: Vec<(String, TrialOutcome)> = Vec::new();
        for t in &topologies {
            let mut all = entries.clone();
            all.push(base_entry.clone());
            let b = backend(plugin.as_ref(), t, &all)?;
            let work: Vec<(&str, &Case)> = all.iter().map(|e| (e.display_name(), &case)).collect();
            b.prepare(&work)?;
            pb.set_message(format!("{t} {base_name}"));
            let mut bo = run_trial(&b, &base_name, &case, None, &opts);
            bo.kind = TrialKind::Sweep;
            if let Some(r) = &bo.roofline {
                baselines.insert(t.clone(), r.time_s);
            }
            writer.write("sweep", &bo)?;
            baseline_rows.push((t.clone(), bo));
            pb.inc(1);
            for e in &entries {
                pb.set_message(format!("{t} {}", e.display_name()));
                let name = e.display_name();
                let mut o = match b.supports(name, &case) {
                    Err(refusal) => {
                        let mut o = TrialOutcome::new(
                            format!("{}/{name}/{}", b.name(), case.id),
                            TrialKind::Sweep,
                            b.name(),
                            name,
                            &case.id,
                        );
                        o.verdict = grpo_conformance::judge::skipped(refusal);
                        o
                    }
                    Ok(()) => run_trial(&b, name, &case, None, &opts),
                };
                o.kind = TrialKind::Sweep;
                if let Some(why) = sweep::out_of_class(&o, class)
                    .filter(|_| matches!(o.verdict, Verdict::Pass | Verdict::Fail))
                {
                    o.verdict = Verdict::Fail;
                    o.detail = Some(why);
                }
                if o.verdict == Verdict::Pass && o.roofline.is_none() {
                    o.verdict = Verdict::Error(format!(
                        "no roofline: {}",
                        o.cost_error
                            .clone()
                            .unwrap_or_else(|| "no published peaks for this generation".into())
                    ));
                }
                writer.write("sweep", &o)?;
                rows.push((t.clone(), o));
                pb.inc(1);
            }
        }
        pb.finish_and_clear();
        print_table(&case, &rows, &baseline_rows, &baselines);
        // A sweep whose option sets compiled nowhere compared nothing.
        if !rows
            .iter()
            .any(|(_, o)| o.memory.is_some() || o.roofline.is_some())
        {
            println!("records: {}", records_path.display());
            return Err(crate::cli::Ended::nothing_checked(format!(
                "the sweep compiled none of its {} option sets on {} (see the table): nothing was compared",
                entries.len(),
                topologies.join(", ")
            )));
        }
        println!(
            "\nbudgets: {} (class {class}: against {base_name})",
            budgets.describe()
        );
        let per = sweep::best_per_topology(&rows);
        for t in &topologies {
            match per.get(t) {
                Some(o) => println!(
                    "best on {t}: {} ({}, {:.2}× {base_name})",
                    o.implementation,
                    human_time(o.roofline.as_ref().unwrap().time_s),
                    sweep::ratio(o, baselines.get(t).copied()).unwrap_or(f64::NAN)
                ),
                None => println!("best on {t}: none within the budgets"),
            }
        }
        let overall = sweep::best_overall(&rows, &baselines);
        match &overall {
            Some((name, worst, on)) => {
                println!("best on every topology: {name} (worst {worst:.2}× {base_name}, on {on})")
            }
            None => println!(
                "best on every topology: none is within the budgets on all of {}",
                topologies.join(", ")
            ),
        }
        println!("records: {}", records_path.display());
        if let Some(path) = &args.write_config {
            let Some((name, worst, on)) = overall else {
                bail!("--write-config {}: no option set is within the budgets on every topology; nothing written", path.display());
            };
            let e = entries
                .iter()
                .find(|e| e.display_name() == name)
                .context("internal: best entry not found")?;
            let text = format!(
                "# grpo-suite sweep --impl {} on {} ({}): the best option set within the budgets\n# ({}, class {class}) on {}; worst {worst:.2}× {base_name}'s roofline, on {on}. Paste under backends: tpu-aot: implementations:.\n{}\n",
                args.implementation,
                case.id,
                grpo_conformance::cost::roofline::GENERATIONS.iter().filter(|g| g.accelerator == grpo_conformance::cost::Accelerator::Tpu).map(|g| g.name).collect::<Vec<_>>().join("/"),
                budgets.describe(),
                topologies.join(", "),
                sweep::config_entry(&args.implementation, &name, &e.options, &budgets)
            );
            grpo_conformance::atomic_file::replace(path, text.as_bytes())?;
            println!("wrote {}", path.display());
        }
        Ok(())
    }

    fn print_table(
        case: &Case,
        rows: &[(String, TrialOutcome)],
        baseline_rows: &[(String, TrialOutcome)],
        baselines: &BTreeMap<String, f64>,
    ) {
        println!("case {}", case.id);
        // The compiler's answer comes last: a refusal's reason is long and would widen every row.
        let head = [
            "topology",
            "option set",
            "peak/floor",
            "matmuls",
            "HBM",
            "roofline",
            "× baseline",
            "compiles",
        ];
        let mut table: Vec<[String; 8]> = Vec::new();
        for (t, o) in baseline_rows.iter().chain(rows) {
            let topo = t.clone();
            let status = match &o.verdict {
                Verdict::Pass => "yes".to_string(),
                Verdict::Fail
                    if o.detail
                        .as_deref()
                        .is_some_and(|d| d.starts_with("OUT OF CLASS")) =>
                {
                    "yes, OUT OF CLASS".to_string()
                }
                Verdict::Fail => "yes, over budget".to_string(),
                Verdict::Ignored(r) => format!(
                    "refused: {}",
                    r.split(": not supported")
                        .last()
                        .unwrap_or(r)
                        .trim_start_matches(": ")
                ),
                Verdict::Error(e) => format!(
                    "no: {}",
                    e.lines()
                        .next()
                        .unwrap_or("")
                        .chars()
                        .take(110)
                        .collect::<String>()
                ),
                other => other.label(),
            };
            let pof = o
                .memory
                .as_ref()
                .and_then(|m| m.peak_over_floor())
                .map_or("-".into(), |r| format!("{r:.3}"));
            let d = o.derived.as_ref();
            let mm = d
                .and_then(|d| {
                    d.matmul_equivalents
                        .map(|m| format!("{m:.2}"))
                        .or(d.logits_passes.map(|p| format!("{p:.2} lp")))
                })
                .unwrap_or("-".into());
            let bytes = d.map_or("-".into(), |d| format!("{:.2} GB", d.work.hbm_bytes / 1e9));
            let roof = o.roofline.as_ref().map_or("-".into(), |r| {
                format!(
                    "{} {}",
                    human_time(r.time_s),
                    if r.mxu_s >= r.hbm_s { "MXU" } else { "HBM" }
                )
            });
            let ratio = sweep::ratio(o, baselines.get(t).copied())
                .map_or("-".into(), |r| format!("{r:.2}"));
            table.push([
                topo,
                o.implementation.clone(),
                pof,
                mm,
                bytes,
                roof,
                ratio,
                status,
            ]);
        }
        crate::cli::print_aligned(head, &table);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> SweepArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct P {
            #[command(flatten)]
            a: SweepArgs,
        }
        let mut v = vec!["x", "--impl", "pallas_fused"];
        v.extend_from_slice(extra);
        P::parse_from(v).a
    }

    #[test]
    fn a_shape_is_a_compile_only_case_and_bad_input_is_one_line() {
        let m = grpo_conformance::cases::load_dir(&grpo_conformance::repo_root().join("cases"))
            .unwrap();
        let c = sweep_case(
            &m,
            &args(&[
                "--shape",
                "level: fused, b: 1, t: 64, h: 128, v: 1000, dtype: bf16",
            ]),
        )
        .unwrap();
        assert!(
            c.compile_only && c.shape.h == Some(128) && c.id.contains("b1_t64_v1000_h128"),
            "{}",
            c.id
        );
        let e = sweep_case(
            &m,
            &args(&[
                "--shape",
                "level: fused, b: 1, t: 64, v: 1000, dtype: bf16, h: 0",
            ]),
        )
        .unwrap_err();
        assert!(format!("{e:#}").starts_with("--shape"), "{e:#}");
        let e = sweep_case(&m, &args(&["--case", "no/such/case"])).unwrap_err();
        assert!(e.to_string().contains("no case `no/such/case`"), "{e}");
        assert!(sweep_case(&m, &args(&[]))
            .unwrap_err()
            .to_string()
            .contains("--case"));
        let s = space_of(
            &args(&["--space", "block_v=512,1024", "--space", "block_tokens=128"]),
            None,
        )
        .unwrap();
        assert_eq!(sweep::option_sets(&s, &Map::new()).len(), 2);
        let e = space_of(&args(&[]), None).unwrap_err().to_string();
        assert!(
            e.contains("declares no search space") && e.contains("--space"),
            "{e}"
        );
    }

    #[test]
    fn budgets_come_from_the_configured_entry_unless_given() {
        let c = Config::parse(
            "backends:\n  tpu-aot:\n    topologies: [v6e:2x2]\n    implementations:\n      - {id: pallas_fused, max_peak_over_floor: 1.1, peak_slack_bytes: 100, max_roofline_over_baseline: 1.0}\n",
            "c.yaml",
        )
        .unwrap();
        let b = budgets(&c, &args(&[]));
        assert_eq!(
            b,
            Budgets {
                max_peak_over_floor: Some(1.1),
                peak_slack_bytes: 100,
                max_roofline_over_baseline: Some(SpeedBudget::All(1.0)),
                min_precision_class: None,
            }
        );
        let b = budgets(&c, &args(&["--max-roofline-over-baseline", "0.5"]));
        assert_eq!(b.max_roofline_over_baseline, Some(SpeedBudget::All(0.5)));
        // The class: the command line's, else the configured entry's.
        use grpo_conformance::precision_class::{ClassRule, PrecisionClass};
        let classed = Config::parse(
            "backends:
  tpu-aot:
    topologies: [v6e:2x2]
    implementations:
      - {id: pallas_fused, min_precision_class: {bf16: bf16x3}}
",
            "c.yaml",
        )
        .unwrap();
        assert_eq!(
            budgets(&classed, &args(&[]))
                .min_precision_class
                .map(|r| r.to_string()),
            Some("{bf16: bf16x3}".into())
        );
        assert_eq!(
            budgets(&classed, &args(&["--precision-class", "f32"])).min_precision_class,
            Some(ClassRule::All(PrecisionClass::F32))
        );
        // A per-generation budget comes through whole.
        let c = Config::parse(
            "backends:\n  tpu-aot:\n    topologies: [v6e:2x2]\n    implementations:\n      - {id: pallas_fused, max_roofline_over_baseline: {v6e: 1.2}}\n",
            "c.yaml",
        )
        .unwrap();
        assert_eq!(
            budgets(&c, &args(&[])).max_roofline_over_baseline,
            Some(SpeedBudget::PerGeneration(
                [("v6e".to_string(), 1.2)].into()
            ))
        );
    }
}
