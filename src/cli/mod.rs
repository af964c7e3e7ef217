//! Command-line interface (clap). Each subcommand lives in its own module.

mod bench_cmd;
mod cost_cmd;
mod export_cmd;
mod golden_cmd;
mod inputs_cmd;
mod numbers;
mod run_cmd;
mod shrink_cmd;
mod sweep_cmd;
mod table;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use grpo_conformance::cases::{CaseSources, GoldenDirs, Matrix, Suite};
use std::path::PathBuf;

/// Exit status of a command that finished with trials that did not pass (FAIL, ERROR,
/// UNEXPECTED PASS).
pub const EXIT_FAILED: i32 = 1;
/// Exit status of a command-line, configuration or environment error (nothing ran, or the
/// run could not be made).
pub const EXIT_USAGE: i32 = 2;
/// Exit status of a run that checked nothing: no trial selected, or none passed.
pub const EXIT_NOTHING_CHECKED: i32 = 3;

/// A command's end that is not a usage error: its exit status and one line.
#[derive(Debug)]
pub struct Ended {
    /// [`EXIT_FAILED`] or [`EXIT_NOTHING_CHECKED`].
    pub code: i32,
    /// What to print after `error: `.
    pub message: String,
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Ended {}

impl Ended {
    /// Trials did not pass.
    pub fn failed(message: String) -> anyhow::Error {
        Ended {
            code: EXIT_FAILED,
            message,
        }
        .into()
    }

    /// Nothing was checked.
    pub fn nothing_checked(message: String) -> anyhow::Error {
        Ended {
            code: EXIT_NOTHING_CHECKED,
            message,
        }
        .into()
    }
}

/// The exit status of a command's error: [`Ended`]'s own, else [`EXIT_USAGE`].
pub fn exit_code(e: &anyhow::Error) -> i32 {
    e.downcast_ref::<Ended>().map_or(EXIT_USAGE, |x| x.code)
}

/// Conformance and performance suite for GRPO loss kernels.
#[derive(Debug, Parser)]
#[command(name = "grpo-suite", version, about)]
pub struct Cli {
    /// A directory of your own case YAML files, added to the suite's matrix (repeatable).
    #[arg(long = "cases", global = true, value_name = "DIR")]
    pub cases: Vec<PathBuf>,
    /// Use the cases of the --cases directories instead of the suite's own.
    #[arg(long, global = true)]
    pub replace_cases: bool,
    /// Keep every table cell whole (by default a table printed to a terminal is fitted
    /// to its width, cells cut with `…`).
    #[arg(long, global = true)]
    pub wide: bool,
    /// Fit tables to N columns, terminal or not.
    #[arg(long, global = true, value_name = "N", conflicts_with = "wide")]
    pub width: Option<usize>,
    /// Where the cases of --cases keep their golden files (default: DIR/golden of the
    /// first --cases DIR); the suite's own cases keep theirs in this checkout's golden/.
    #[arg(long, global = true, value_name = "DIR")]
    pub golden_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the case ids of a suite; with an ID, say whether it is a valid case (in the
    /// matrix or not, what `run --case` and `shrink` take) or, in one line, why not.
    Cases {
        /// smoke | ci | nightly | full
        #[arg(long, default_value = "ci")]
        suite: Suite,
        /// Print one JSON object per case instead of ids.
        #[arg(long)]
        json: bool,
        /// A case id to check instead of listing.
        id: Option<String>,
    },
    /// Run implementations on a suite's cases and judge them against the oracle.
    Run(run_cmd::RunArgs),
    /// Bless (update) or check golden files.
    Golden {
        #[command(subcommand)]
        action: golden_cmd::GoldenAction,
    },
    /// Compare two runs' records: verdicts, vanished trials, error growth, compiled peak,
    /// time. Exit status 0 (no regression), 1 (regressed), 2 (cannot compare).
    Compare {
        /// The earlier run's JSONL records.
        base: PathBuf,
        /// The later run's JSONL records.
        new: PathBuf,
        /// Print the comparison as JSON instead of Markdown.
        #[arg(long)]
        json: bool,
    },
    /// Merge the records of a split run's shards (`run --partition I/N`) into one records
    /// file, which `compare`, `report` and `run --resume` take as an unsplit run's.
    /// Refuses shards of different runs, a duplicate or missing index, a trial in two
    /// shards or outside its shard's assignment, and an assigned trial without a record.
    Merge {
        /// The merged records file to write.
        out: PathBuf,
        /// The shards' records files, or directories holding them (each `*.jsonl` with its
        /// `.plan.json` stamp).
        #[arg(required = true)]
        shards: Vec<PathBuf>,
        /// Write an assigned trial without a record as an ERROR line instead of refusing.
        #[arg(long)]
        allow_incomplete: bool,
    },
    /// Write a self-contained HTML report (report.html) and its Markdown summary
    /// (report.md) of a run's records, optionally compared with a baseline run.
    Report {
        /// The run's JSONL records.
        run: PathBuf,
        /// A baseline run to compare with.
        #[arg(long)]
        baseline: Option<PathBuf>,
        /// Output directory (created).
        #[arg(long)]
        out: PathBuf,
    },
    /// Compile every option set of an implementation's search space deviceless on TPU
    /// topologies for one case and print compiles, peak/floor, matmuls, HBM bytes and
    /// roofline time against jax_baseline's; the best within the budgets.
    Sweep(sweep_cmd::SweepArgs),
    /// The derived cost and roofline of one exported TPU module (an artifact directory):
    /// where the HBM bytes and MXU FLOPs go, loops and their trip counts, kernels.
    Cost(cost_cmd::CostArgs),
    /// Time implementations on an executing backend at cases' shapes without judging
    /// them (compile-only cases too): median, ratio to jax_baseline, device peak,
    /// compiled peak/floor, derived matmuls and roofline, measured/roofline.
    Bench(bench_cmd::BenchArgs),
    /// Export a run's records as a W&B offline run and/or TensorBoard event files.
    Export(export_cmd::ExportArgs),
    /// Shrink a failing trial to the smallest case that still fails the same way (its
    /// signature: the gate's output, the class, the budget, the error), with the
    /// boundaries found and, with --out, a reproducer that runs without the suite.
    Shrink(shrink_cmd::ShrinkArgs),
    /// Write a case's inputs and the oracle's outputs as .npy files plus case.json.
    Inputs {
        /// The case id (see `grpo-suite cases --suite full`).
        case_id: String,
        /// Output directory (created).
        #[arg(long)]
        out: PathBuf,
    },
}

/// Prints a header and rows as left-aligned columns two spaces apart (no trailing
/// blanks), fitted to the terminal's width unless `--wide` ([`table`]).
pub fn print_aligned<const N: usize>(head: [&str; N], rows: &[[String; N]]) {
    table::print(head, rows)
}

/// Ends the process on a command-line error: help and version as clap prints them, any
/// other error as one line on stderr (clap's message and its tip, without the usage
/// block), exit 2.
pub fn exit_on_parse_error(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit()
    }
    eprintln!("{}", one_line(&e.render().to_string()));
    std::process::exit(2)
}

/// clap's rendered error as one line: the `error:` line, the arguments it lists below
/// it (`<NEW>`, `--impl <IMPL>`: the missing ones), the subcommand's usage, and any
/// `tip:` lines.
fn one_line(rendered: &str) -> String {
    let raw: Vec<&str> = rendered.lines().collect();
    let mut out = raw
        .first()
        .map(|l| l.trim())
        .unwrap_or("error: invalid command line")
        .to_string();
    let listed: Vec<&str> = raw
        .iter()
        .skip(1)
        .take_while(|l| l.starts_with("  ") && !l.trim().is_empty())
        .map(|l| l.trim())
        .collect();
    if !listed.is_empty() {
        out.push(' ');
        out.push_str(&listed.join(", "));
        if let Some(usage) = raw.iter().find_map(|l| l.trim().strip_prefix("Usage: ")) {
            out.push_str(&format!(" (usage: {usage})"));
        }
    }
    let lines = raw.iter().map(|l| l.trim());
    for tip in lines.filter(|l| l.starts_with("tip:")) {
        out.push_str(" (");
        out.push_str(tip);
        out.push(')');
    }
    out
}

/// The case directories the command line names.
pub fn case_sources(cli: &Cli) -> CaseSources {
    CaseSources {
        suite_dir: grpo_conformance::repo_root().join("cases"),
        user_dirs: cli.cases.clone(),
        replace: cli.replace_cases,
        user_golden_dir: cli.golden_dir.clone(),
    }
}

/// Loads the case matrix and where each case's golden file is.
pub fn load_matrix(sources: &CaseSources) -> Result<(Matrix, GoldenDirs)> {
    sources
        .load(grpo_conformance::repo_root().join("golden"))
        .context("loading the case matrix")
}

/// Runs the parsed command.
pub fn dispatch(cli: Cli) -> Result<()> {
    table::set_policy(cli.wide, cli.width);
    let sources = case_sources(&cli);
    let (matrix, golden) = load_matrix(&sources)?;
    match cli.command {
        Command::Cases {
            json, id: Some(id), ..
        } => {
            let (case, place) = match matrix.get(&id) {
                Some(c) => {
                    let suites: Vec<&str> = c.suites.iter().map(|s| s.name()).collect();
                    (
                        c.clone(),
                        format!("in the matrix (suites {}; {})", suites.join(", "), c.origin),
                    )
                }
                None => (
                    grpo_conformance::cases::parse_id(&id).map_err(|e| anyhow::anyhow!(e))?,
                    "valid, outside the matrix: `grpo-suite run --case ID` runs it".into(),
                ),
            };
            if json {
                println!("{}", serde_json::to_string(&case)?);
            } else {
                println!("{id}: {place}");
            }
            Ok(())
        }
        Command::Cases { suite, json, .. } => {
            for c in matrix.suite(suite) {
                if json {
                    println!("{}", serde_json::to_string(c)?);
                } else {
                    println!("{}", c.id);
                }
            }
            Ok(())
        }
        Command::Run(args) => run_cmd::run(&matrix, &sources, &golden, args),
        Command::Sweep(args) => sweep_cmd::run(&matrix, args),
        Command::Cost(args) => cost_cmd::run(args),
        Command::Bench(args) => bench_cmd::run(&matrix, args),
        Command::Export(args) => export_cmd::run(args),
        Command::Shrink(args) => shrink_cmd::run(&matrix, sources.replace, args),
        Command::Golden { action } => golden_cmd::run(&matrix, &golden, action),
        Command::Report { run, baseline, out } => {
            let w = grpo_conformance::report::write(&run, baseline.as_deref(), &out)?;
            println!("wrote {} and {}", w.html.display(), w.markdown.display());
            Ok(())
        }
        Command::Compare { base, new, json } => {
            let (b, n) = (
                grpo_conformance::compare::load(&base)?,
                grpo_conformance::compare::load(&new)?,
            );
            if let Some(why) = grpo_conformance::compare::incompatible(&b, &n) {
                anyhow::bail!(
                    "cannot compare {} and {}: {why}",
                    base.display(),
                    new.display()
                );
            }
            let c = grpo_conformance::compare::compare(&b, &n);
            if json {
                println!("{}", serde_json::to_string_pretty(&c)?);
            } else {
                print!(
                    "{}",
                    grpo_conformance::compare::markdown(&base, &new, &b, &c)
                );
            }
            if c.regressed() {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Merge {
            out,
            shards,
            allow_incomplete,
        } => {
            let files = grpo_conformance::merge::shard_files(&shards)?;
            let m = grpo_conformance::merge::merge(&out, &files, allow_incomplete)?;
            println!(
                "merged {} shards: {} records into {}{}",
                m.shards,
                m.lines,
                out.display(),
                if m.missing.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; {} assigned trials without a record are ERROR lines",
                        m.missing.len()
                    )
                }
            );
            Ok(())
        }
        Command::Inputs { case_id, out } => {
            let case = matrix.get(&case_id).with_context(|| {
                format!(
                    "no case `{case_id}` in the case matrix (list them with `grpo-suite cases --suite full`)"
                )
            })?;
            inputs_cmd::write(case, &out).map(|_| ())
        }
    }
}
