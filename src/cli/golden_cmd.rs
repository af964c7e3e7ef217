//! `grpo-suite golden update|check`.

use anyhow::{bail, Result};
use clap::Subcommand;
use grpo_conformance::cases::{GoldenDirs, Matrix, Suite};
use grpo_conformance::golden::{self, Check, BLESS_HINT};
use grpo_conformance::runner::Prepared;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;

/// Which golden files.
#[derive(Debug, clap::Args)]
pub struct GoldenArgs {
    /// smoke | ci | nightly | full
    #[arg(long, default_value = "ci")]
    suite: Suite,
    /// Golden directory (default: this checkout's golden/, or with --cases the cases'
    /// own golden directory, --golden-dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Only cases whose id this selects: whole `/`-separated segments (`logits/bf16`), a
    /// `*`-glob, or `~substring` (as `run --filter`).
    #[arg(long)]
    filter: Option<String>,
}

/// What to do with golden files.
#[derive(Debug, Subcommand)]
pub enum GoldenAction {
    /// Re-derive the golden files of a suite, show what changes (per case and output, old
    /// vs new, versions), then write them (bless).
    Update {
        /// Which golden files.
        #[command(flatten)]
        args: GoldenArgs,
        /// Show what would change and write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Write even if values change without an oracle or generator version bump.
        #[arg(long)]
        force: bool,
    },
    /// Re-derive the golden values and compare with the stored files.
    Check(GoldenArgs),
}

fn bar(n: usize) -> ProgressBar {
    let pb = ProgressBar::new(n as u64);
    pb.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed_precise} {wide_msg}").unwrap(),
    );
    pb
}

/// Runs the action.
///
/// With `--cases DIR`, it handles the cases that only those directories define, in their
/// own golden directory: a user's golden files never go into this checkout.
pub fn run(matrix: &Matrix, golden_dirs: &GoldenDirs, action: GoldenAction) -> Result<()> {
    let (update, dry_run, force, GoldenArgs { suite, dir, filter }) = match action {
        GoldenAction::Update {
            args,
            dry_run,
            force,
        } => (true, dry_run, force, args),
        GoldenAction::Check(a) => (false, false, false, a),
    };
    let users = !golden_dirs.user_ids.is_empty();
    let ours = |c: &&grpo_conformance::cases::Case| !users || golden_dirs.is_user(c);
    let dir = dir.unwrap_or_else(|| {
        if users {
            golden_dirs.user.clone()
        } else {
            golden_dirs.suite.clone()
        }
    });
    let cases: Vec<_> = matrix
        .suite(suite)
        .into_iter()
        .filter(ours)
        .filter(|c| {
            filter
                .as_deref()
                .is_none_or(|f| grpo_conformance::trials::filter_matches(f, &c.id))
        })
        .filter(|c| !c.compile_only) // no inputs, oracle or golden values
        .collect();
    if cases.is_empty() {
        return Err(super::Ended::nothing_checked(format!("no case of suite {suite} with golden values matches the filter: nothing would be checked")));
    }
    if !update && !dir.is_dir() {
        bail!(
            "golden directory {} does not exist (check --dir)",
            dir.display()
        );
    }
    let pb = bar(cases.len());
    let mut problems = Vec::new();
    // Cases the host-memory check refused: neither checked nor written.
    let mut refused = Vec::new();
    // Update: (case, path, new record, what changed, whether the versions moved).
    let mut changes: Vec<(String, PathBuf, golden::Golden, Vec<String>, bool)> = Vec::new();
    let (mut unchanged, mut new) = (0usize, 0usize);
    for c in &cases {
        pb.set_message(c.id.clone());
        if let Err(e) = grpo_conformance::trials::check_host_memory(c) {
            refused.push(format!("{}: {e}", c.id));
            pb.inc(1);
            continue;
        }
        let p = Prepared::new(c);
        let path = golden::path(&dir, c);
        if update {
            let now = golden::compute(c, &p.inputs, &p.oracle);
            match golden::read(&path) {
                Ok(Some(stored)) => {
                    let d = golden::diff(&stored, &now);
                    // A generator bump versions the change only where it moved an input.
                    let inputs_moved = stored.inputs != now.inputs;
                    let versioned = stored.provenance.oracle_version
                        != now.provenance.oracle_version
                        || (stored.provenance.generator_version
                            != now.provenance.generator_version
                            && inputs_moved);
                    if d.is_empty()
                        && stored.provenance.oracle_version == now.provenance.oracle_version
                    {
                        unchanged += 1;
                    } else {
                        let mut lines = vec![format!(
                            "versions: oracle v{} → v{}, generator v{} → v{}",
                            stored.provenance.oracle_version,
                            now.provenance.oracle_version,
                            stored.provenance.generator_version,
                            now.provenance.generator_version
                        )];
                        lines.extend(d);
                        changes.push((c.id.clone(), path, now, lines, versioned));
                    }
                }
                Ok(None) => {
                    new += 1;
                    changes.push((
                        c.id.clone(),
                        path,
                        now,
                        vec!["new golden file".into()],
                        true,
                    ));
                }
                Err(e) => changes.push((c.id.clone(), path, now, vec![format!("{e:#}")], true)),
            }
        } else {
            match golden::check(&dir, c, &p.inputs, &p.oracle) {
                Ok(Check::Match) => {}
                Ok(Check::Mismatch(d)) => {
                    problems.push(format!("{}:\n  {}", path.display(), d.join("\n  ")))
                }
                Err(e) => problems.push(format!("{e:#}")),
            }
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    for r in &refused {
        eprintln!("{r}");
    }
    let refused_err = || {
        anyhow::anyhow!(
            "golden {}: {} of {} cases refused (host memory, above): nothing {} for them",
            if update { "update" } else { "check" },
            refused.len(),
            cases.len(),
            if update { "written" } else { "checked" }
        )
    };
    if update {
        for (id, _, _, lines, _) in &changes {
            println!("{id}\n  {}", lines.join("\n  "));
        }
        let unversioned: Vec<&String> = changes.iter().filter(|c| !c.4).map(|c| &c.0).collect();
        let refused_n = if refused.is_empty() {
            String::new()
        } else {
            format!(", {} refused", refused.len())
        };
        println!(
            "golden update: {unchanged} unchanged, {} changed, {new} new{refused_n} ({} change values without an oracle or generator version bump)",
            changes.len() - new,
            unversioned.len()
        );
        if dry_run {
            println!("dry run: nothing written");
            return if refused.is_empty() {
                Ok(())
            } else {
                Err(refused_err())
            };
        }
        if !unversioned.is_empty() && !force {
            bail!(
                "{} golden files would change values without an oracle or generator version bump (first: {}); \
                 review the diff above and pass --force if the change is intended",
                unversioned.len(),
                unversioned[0]
            );
        }
        for (_, path, now, _, _) in &changes {
            golden::store(path, now)?;
        }
        if !changes.is_empty() || refused.is_empty() {
            eprintln!(
                "wrote {} golden files under {}",
                changes.len(),
                dir.display()
            );
        }
        if suite == Suite::Full {
            let all: Vec<_> = matrix.suite(Suite::Full).into_iter().filter(ours).collect();
            for o in golden::orphans(&dir, &all) {
                eprintln!(
                    "note: {} belongs to no case; delete it if the case was removed",
                    o.display()
                );
            }
        }
        return if refused.is_empty() {
            Ok(())
        } else {
            Err(refused_err())
        };
    }
    if problems.is_empty() && refused.is_empty() {
        eprintln!("golden check: {} cases match", cases.len());
        Ok(())
    } else if problems.is_empty() {
        Err(refused_err())
    } else {
        for p in &problems {
            eprintln!("{p}");
        }
        let also = if refused.is_empty() {
            String::new()
        } else {
            format!(" ({} refused: host memory, above)", refused.len())
        };
        Err(super::Ended::failed(format!(
            "golden check: {} of {} cases differ{also}; {BLESS_HINT}",
            problems.len(),
            cases.len()
        )))
    }
}
