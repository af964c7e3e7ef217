//! The conformance harness (libtest-mimic): one trial per (backend, implementation, case),
//! named `backend/implementation/case-id`, so `cargo test --test conformance -- bf16`
//! slices the matrix. Also:
//! - `golden/<case-id>`: the oracle re-derived now matches the stored golden file
//!   (`GRPO_BLESS=1` rewrites them instead);
//! - `should-fail/<mutation>`: a deliberately wrong implementation must fail at least one
//!   case of the suite: an unexpected pass is a failure of the harness.
//!
//! The suite is `ci` unless `GRPO_SUITE` says otherwise (`smoke`, `nightly`, `full`).

use grpo_conformance::backend::{self, Backend, Mutation, NaiveF32, RunOptions};
use grpo_conformance::cases::{self, Case, Suite};
use grpo_conformance::backend::pjrt::{tpu_export_check, ExportVerdict};
use grpo_conformance::config::Config;
use grpo_conformance::golden::{self, Check, BLESS_ENV};
use grpo_conformance::runner::{run_trial, CaseCache, Verdict};
use grpo_conformance::{gates, repo_root};
use libtest_mimic::{Arguments, Completion, Failed, Trial};
use std::sync::Arc;

fn main() {
    let args = Arguments::from_args();
    let suite: Suite = match std::env::var("GRPO_SUITE").as_deref().unwrap_or("ci").parse() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: GRPO_SUITE: {e}");
            std::process::exit(2);
        }
    };
    let matrix = match cases::load_dir(&repo_root().join("cases")) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    };
    let cases: Vec<Arc<Case>> = matrix.suite(suite).into_iter().cloned().map(Arc::new).collect();
    let cache = Arc::new(CaseCache::default());
    // GRPO_CONFIG names the run configuration; by default the nightly tier uses
    // configs/nightly.yaml (no interpret-mode Pallas at full shapes), the others default.yaml.
    let config = match std::env::var_os("GRPO_CONFIG") {
        Some(p) => Config::load(std::path::Path::new(&p)),
        None if suite == Suite::Nightly => Config::load(&repo_root().join("configs/nightly.yaml")),
        None => Config::load_default(),
    };
    let config = config.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    });
    let (backends, unavailable) = backend::available(&config);
    // GRPO_REQUIRE_BACKENDS=a,b turns "unavailable" into a failing trial (CI sets it, so a
    // broken set-up can never pass as a run of ignored trials).
    let required: Vec<String> = std::env::var("GRPO_REQUIRE_BACKENDS")
        .map(|s| s.split(',').filter(|x| !x.is_empty()).map(String::from).collect())
        .unwrap_or_default();
    let backends: Vec<Arc<dyn Backend>> = backends.into_iter().map(Arc::from).collect();
    let mut trials = Vec::new();
    for b in &backends {
        let work: Vec<(String, Arc<Case>)> =
            b.implementations().into_iter().flat_map(|i| cases.iter().map(move |c| (i.clone(), c.clone()))).collect();
        let refs: Vec<(&str, &Case)> = work.iter().map(|(i, c)| (i.as_str(), c.as_ref())).collect();
        if let Err(e) = b.prepare(&refs) {
            let msg = format!("{e:#}");
            trials.push(Trial::test(format!("{}/prepare", b.name()), move || Err(msg.into())));
        }
    }

    for b in &backends {
        for imp in b.implementations() {
            for c in &cases {
                let name = format!("{}/{imp}/{}", b.name(), c.id);
                if let Err(reason) = b.supports(&imp, c) {
                    trials.push(Trial::ignorable_test(name, move || Ok(Completion::ignored_with(reason))));
                    continue;
                }
                cache.expect(c, 1);
                let (b, c, cache, imp) = (b.clone(), c.clone(), cache.clone(), imp.clone());
                trials.push(Trial::test(name, move || {
                    let prep = cache.get(&c);
                    let o = run_trial(b.as_ref(), &imp, &c, &prep, &RunOptions { warmup: 0, repeats: 0 });
                    cache.done(&c);
                    match o.verdict {
                        Verdict::Pass => Ok(()),
                        _ => Err(Failed::from(o.failure_text())),
                    }
                }));
            }
        }
    }
    for (name, why) in unavailable {
        if required.contains(&name) {
            trials.push(Trial::test(format!("{name}/available"), move || Err(format!("required backend unavailable: {why}").into())));
        } else {
            trials.push(Trial::ignorable_test(format!("{name}/unavailable"), move || Ok(Completion::ignored_with(why))));
        }
    }

    // Mosaic lowering for TPU, per case, for the configured Pallas kernels.
    let tpu: Vec<_> = config.tpu_export.iter().map(|e| e.resolved()).filter(|c| c.enabled).collect();
    if !tpu.is_empty() {
        let refs: Vec<&Case> = cases.iter().map(|c| c.as_ref()).collect();
        match tpu_export_check(&tpu, &refs) {
            Err(e) => {
                let msg = format!("{e:#}");
                trials.push(Trial::test("tpu-export/batch", move || Err(msg.into())));
            }
            Ok(results) => {
                for (name, case, verdict) in results {
                    let tname = format!("tpu-export/{name}/{case}");
                    trials.push(match verdict {
                        ExportVerdict::Lowered => Trial::test(tname, || Ok(())),
                        ExportVerdict::Unsupported(why) => Trial::ignorable_test(tname, move || Ok(Completion::ignored_with(why))),
                        ExportVerdict::Failed(e) => Trial::test(tname, move || Err(e.into())),
                    });
                }
            }
        }
    }

    let bless = std::env::var(BLESS_ENV).is_ok_and(|v| v == "1");
    let gdir = repo_root().join("golden");
    for c in &cases {
        cache.expect(c, 1);
        let (c, cache, gdir) = (c.clone(), cache.clone(), gdir.clone());
        trials.push(Trial::test(format!("golden/{}", c.id), move || {
            let prep = cache.get(&c);
            let res = if bless {
                golden::store(&golden::path(&gdir, &c), &golden::compute(&c, &prep.inputs, &prep.oracle)).map(|_| Check::Match)
            } else {
                golden::check(&gdir, &c, &prep.inputs, &prep.oracle)
            };
            cache.done(&c);
            match res {
                Ok(Check::Match) => Ok(()),
                Ok(Check::Mismatch(d)) => Err(format!("{}\n{}", d.join("\n"), golden::BLESS_HINT).into()),
                Err(e) => Err(format!("{e:#}").into()),
            }
        }));
    }

    // Deliberately wrong implementations must be caught somewhere in the suite.
    if suite != Suite::Nightly {
        for m in Mutation::ALL {
            let cases = cases.clone();
            trials.push(Trial::test(format!("should-fail/naive_f32+{m:?}"), move || {
                let imp = NaiveF32 { mutation: Some(m) };
                for c in cases.iter().filter(|c| imp.supports(c).is_ok()) {
                    let inputs = grpo_conformance::inputs::Inputs::generate(c);
                    let oracle = grpo_conformance::oracle::Oracle::new(c, &inputs);
                    let reports = gates::judge(c, &inputs, &oracle, &imp.run(c, &inputs));
                    if let Some(r) = reports.iter().find(|r| !r.passed) {
                        eprintln!("caught on {}: {}", c.id, r.message);
                        return Ok(());
                    }
                }
                Err(format!("flagged as should-fail but it passed every case of the suite ({m:?})").into())
            }));
        }
    }

    libtest_mimic::run(&args, trials).exit();
}
