//! The conformance harness (libtest-mimic) over the same trial list as `grpo-suite run`
//! (`grpo_conformance::trials`): `backend/implementation/case`, `golden/case`,
//! `should-fail/variant`, so `cargo test --test conformance -- bf16` slices the matrix.
//! libtest's filter is applied before anything is prepared: a filtered run on a cold
//! cache exports only the modules of the trials it runs. Every trial is also written to
//! a JSONL record (`GRPO_RECORDS`, default `target/grpo-records/`).
//!
//! One more trial, `harness/same-trials-as-cli`, checks that `grpo-suite run --list`
//! names exactly this harness's trials.
//!
//! The suite is `ci` unless `GRPO_SUITE` says otherwise (`smoke`, `nightly`, `full`).

use grpo_conformance::backends::RunOptions;
use grpo_conformance::cases;
use grpo_conformance::config::Config;
use grpo_conformance::listing;
use grpo_conformance::partition::{split, Weights};
use grpo_conformance::records::RecordWriter;
use grpo_conformance::run_identity::RunIdentity;
use grpo_conformance::runner::{CaseCache, Verdict};
use grpo_conformance::trials::{Plan, Selection};
use grpo_conformance::{env, repo_root};
use libtest_mimic::{Arguments, Completion, Failed, Trial};
use std::sync::{Arc, Mutex};

/// The `grpo-suite` binary: where nextest says it is when it runs an extracted test
/// archive (`NEXTEST_BIN_EXE_grpo-suite`), else where cargo built it.
fn grpo_suite_binary() -> std::path::PathBuf {
    ["NEXTEST_BIN_EXE_grpo-suite", "NEXTEST_BIN_EXE_grpo_suite"]
        .iter()
        .find_map(std::env::var_os)
        .map(Into::into)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_grpo-suite").into())
}

fn fail(e: impl std::fmt::Display) -> ! {
    eprintln!("error: {e:#}");
    std::process::exit(2);
}

fn main() {
    // The PJRT plugins log INFO lines through absl (the CUDA plugin's allocator, ptxas):
    // warnings and errors only, unless the user chose otherwise (as grpo-suite does).
    if std::env::var_os("TF_CPP_MIN_LOG_LEVEL").is_none() {
        std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "1");
    }
    #[cfg(feature = "pjrt")]
    grpo_conformance::backends::pjrt::tpu_aot::prepare_environment();
    let args = Arguments::from_args();
    env::check_all().unwrap_or_else(|e| fail(e));
    let suite = env::suite().unwrap_or_else(|e| fail(e));
    let matrix = cases::load_dir(&repo_root().join("cases")).unwrap_or_else(|e| fail(e));
    let config_path = Config::path_for(None, suite).unwrap_or_else(|e| fail(e));
    let config = Config::load(&config_path).unwrap_or_else(|e| fail(e));
    let bless = env::bless().unwrap_or_else(|e| fail(e));
    // A listing opens no backend; a process that runs one named trial (`--exact NAME`,
    // as cargo-nextest starts one per test) opens only that trial's backend.
    let backend_names = config.backends.names();
    let open: Option<Vec<String>> = if args.list {
        Some(Vec::new())
    } else if args.exact {
        args.filter.as_deref().map(|f| {
            listing::backend_of(f, &backend_names)
                .into_iter()
                .cloned()
                .collect()
        })
    } else {
        None
    };
    let required = env::require_backends();
    let mut plan = match &open {
        Some(o) => Plan::build_opening(&matrix, suite, &config, &required, bless, o),
        None => Plan::build(&matrix, suite, &config, &required, bless),
    }
    .unwrap_or_else(|e| fail(e));
    let full_list = plan.names();
    // GRPO_PARTITION=I/N: the same split as `grpo-suite run --partition I/N`, before
    // libtest's filter (a shard of the whole plan; nextest then runs its tests).
    let split = env::partition().unwrap_or_else(|e| fail(e)).map(|p| {
        let p = p
            .parse()
            .unwrap_or_else(|e| fail(anyhow::anyhow!("{}: {e}", env::PARTITION)));
        let weights = env::partition_weights()
            .unwrap_or_else(|e| fail(e))
            .map(|w| Weights::read(&w).unwrap_or_else(|e| fail(e)));
        let s = split(&mut plan, p, weights.as_ref());
        eprintln!("{}", s.summary());
        s
    });
    plan.select(&Selection {
        filters: args.filter.iter().cloned().collect(),
        skip: args.skip.clone(),
        exact: args.exact,
        ..Default::default()
    });

    let mut trials = Vec::new();
    // The CLI must list the same trials (before any filter).
    {
        let cfg = config_path.clone();
        trials.push(Trial::test("harness/same-trials-as-cli", move || {
            let o = std::process::Command::new(grpo_suite_binary())
                .args(["run", "--suite", suite.name(), "--list", "--config"])
                .arg(&cfg)
                .output()
                .map_err(|e| format!("cannot run grpo-suite: {e}"))?;
            if !o.status.success() {
                return Err(format!("grpo-suite run --list failed: {}", String::from_utf8_lossy(&o.stderr)).into());
            }
            let cli: Vec<String> = String::from_utf8_lossy(&o.stdout).lines().map(String::from).collect();
            if cli != full_list {
                let only_cli: Vec<_> = cli.iter().filter(|n| !full_list.contains(n)).take(5).collect();
                let only_harness: Vec<_> = full_list.iter().filter(|n| !cli.contains(n)).take(5).collect();
                return Err(format!(
                    "trial lists differ: CLI {} trials, harness {}; only in CLI: {only_cli:?}; only in harness: {only_harness:?}",
                    cli.len(),
                    full_list.len()
                )
                .into());
            }
            Ok(())
        }));
    }

    if args.list {
        // Listing prepares nothing: no export, no inputs, no backend opened. Not-applicable
        // combinations are not tests; trials known to be ignored are listed as ignored
        // (`--list --ignored`), so cargo-nextest starts no process for either.
        let levels = listing::exporter_levels().unwrap_or_else(|e| fail(e));
        for t in &plan.trials {
            match listing::verdict(t, &levels, &config) {
                Some(Verdict::NotApplicable(_)) => {}
                Some(_) => {
                    trials.push(Trial::test(t.name.clone(), || Ok(())).with_ignored_flag(true))
                }
                None => trials.push(Trial::test(t.name.clone(), || Ok(()))),
            }
        }
        let conclusion = libtest_mimic::run(&args, trials);
        // The backends (their PJRT clients) end before the process does: a CUDA plugin
        // logs an error per executable that outlives its context at exit.
        drop(plan);
        conclusion.exit();
    }

    let prepare_errors = plan.prepare();
    for (b, e) in prepare_errors {
        trials.push(Trial::test(format!("{b}/prepare"), move || Err(e.into())));
    }
    let records = {
        let path =
            env::records()
                .unwrap_or_else(|e| fail(e))
                .unwrap_or_else(|| match std::env::var("NEXTEST_RUN_ID") {
                    // Under cargo-nextest, one file per process (per test attempt) in one
                    // directory per run.
                    Ok(run) => {
                        let attempt = std::env::var("NEXTEST_ATTEMPT_ID")
                            .map(|a| {
                                a.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_")
                            })
                            .unwrap_or_else(|_| std::process::id().to_string());
                        repo_root()
                            .join("target/grpo-records")
                            .join(format!("nextest-{run}"))
                            .join(format!("{attempt}.jsonl"))
                    }
                    Err(_) => {
                        let t = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map(|d| d.as_secs())
                            .unwrap_or(0);
                        repo_root()
                            .join("target/grpo-records")
                            .join(format!("cargo-test-{}-{t}.jsonl", suite.name()))
                    }
                });
        // Stamped with the run identity (what `--resume` and `merge` check) and, for a
        // shard, the plan's stamp beside the file.
        let identity =
            RunIdentity::of(suite.name(), &config_path, &config).unwrap_or_else(|e| fail(e));
        if let Some(s) = split {
            let mut st = s.stamp(&identity.config_digest, suite.name());
            st.run_id = std::env::var("NEXTEST_RUN_ID").ok();
            st.write(&path).unwrap_or_else(|e| fail(e));
        }
        Arc::new(Mutex::new(
            RecordWriter::open(&path)
                .unwrap_or_else(|e| fail(e))
                .with_identity(identity),
        ))
    };
    let cache = Arc::new(CaseCache::default());
    plan.announce(&cache);
    let plan = Arc::new(plan);
    let opts = RunOptions {
        warmup: 0,
        repeats: 0,
    };
    let mut not_applicable = 0;
    for k in 0..plan.trials.len() {
        let t = &plan.trials[k];
        match plan.ignored(t) {
            Some(Verdict::NotApplicable(_)) => {
                // Recorded (as the CLI does) but not a test: the combination does not exist.
                let o = plan.execute(t, &cache, &opts);
                records.lock().unwrap().write(suite.name(), &o).ok();
                not_applicable += 1;
                continue;
            }
            Some(v) => {
                // Still executed (it only records the ignored verdict, frees the case share).
                let reason = match v {
                    Verdict::Ignored(r) => r,
                    other => other.label(),
                };
                let (plan, cache, records) = (plan.clone(), cache.clone(), records.clone());
                let o = plan.execute(&plan.trials[k], &cache, &opts);
                records.lock().unwrap().write(suite.name(), &o).ok();
                trials.push(Trial::ignorable_test(t.name.clone(), move || {
                    Ok(Completion::ignored_with(reason))
                }));
                continue;
            }
            None => {}
        }
        let (plan, cache, records) = (plan.clone(), cache.clone(), records.clone());
        trials.push(Trial::test(t.name.clone(), move || {
            let o = plan.execute(&plan.trials[k], &cache, &opts);
            if let Err(e) = records.lock().unwrap().write(suite.name(), &o) {
                eprintln!("warning: cannot write the record of {}: {e:#}", o.name);
            }
            match &o.verdict {
                Verdict::Pass => Ok(()),
                Verdict::ExpectedFail(_) => {
                    // failure_text starts with "expected failure: <reason>", then what
                    // failed (the reason once, not twice).
                    eprintln!("{}: {}", o.name, o.failure_text().replace('\n', "\n  "));
                    Ok(())
                }
                Verdict::Ignored(_) | Verdict::NotApplicable(_) => Ok(()),
                _ => Err(Failed::from(o.failure_text())),
            }
        }));
    }
    if not_applicable > 0 {
        eprintln!("note: {not_applicable} trials not applicable (a level the implementation does not have, or more devices than the topology): recorded, not listed");
    }
    let conclusion = libtest_mimic::run(&args, trials);
    drop((plan, cache, records));
    conclusion.exit();
}
