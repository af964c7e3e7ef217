//! `grpo-suite bench`: time implementations on an executing backend at cases' shapes,
//! without judging them (no oracle: the seeds' fused shape takes it hours on a CPU).
//! Each row: median time and its ratio to jax_baseline's in the same run, the device
//! allocator's peak, the compiled peak over the floor, the derived matmuls and roofline,
//! and measured / roofline. Compile-only cases are accepted: this is where they execute.
//! The inputs are the case's, but for old_logp and ref_logp, which are not placed by the
//! oracle's forward pass ([`Inputs::generate_for_timing`]): dense products take the same
//! time whatever the values.

use anyhow::{bail, Context, Result};
use clap::Args;
use grpo_conformance::backends::{Backend, RunOptions, RunResult};
use grpo_conformance::cases::{Case, Matrix};
use grpo_conformance::config::{glob_match, Config};
use grpo_conformance::inputs::Inputs;
use std::path::PathBuf;
use std::sync::Arc;

/// Arguments of `bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Cases to run: a glob (`|` for alternatives) over the case ids of every tier
    /// (`grpo-suite cases --suite full`).
    #[arg(long = "case", value_name = "GLOB")]
    pub case: String,
    /// The executing backend (e.g. pjrt-gpu, pjrt-cpu).
    #[arg(long)]
    pub backend: String,
    /// Implementations to run: a glob over the backend's entry names (default: all), run
    /// in the order of its `|` alternatives. The device allocator's peak counts from the
    /// client's start, so a trial has a device peak of its own only above every earlier
    /// trial's: list the lighter implementations first.
    #[arg(long = "impl")]
    pub implementations: Option<String>,
    /// Run configuration (default: GRPO_CONFIG, else configs/default.yaml, as `run`).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Timed executions per implementation and case.
    #[arg(long, default_value_t = 10)]
    pub runs: usize,
    /// Untimed executions before timing.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// Also write each row as a JSON line to this file (checked writable before timing).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Seconds one implementation on one case may take, warm-up and timed runs together
    /// (default: the config's `trial_timeout_s`, as `run`). Past it the bench stops with
    /// one line naming the pair, after printing (and writing) the rows measured so far.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<u64>,
}

/// Checks before any timing that `path` can be written (a temporary file beside it, as
/// the final write makes), so measurements are never thrown away at the end.
fn check_writable(path: &std::path::Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    if path.is_dir() {
        bail!(
            "--json {}: is a directory (give a file path)",
            path.display()
        );
    }
    let probe = dir.join(format!(".grpo-bench-probe-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map(|_| {
            let _ = std::fs::remove_file(&probe);
        })
        .map_err(|e| {
            anyhow::anyhow!(
                "--json {}: cannot write in {} ({e})",
                path.display(),
                dir.display()
            )
        })
}

/// Writes the rows as JSON lines to `path`.
fn write_json(path: &std::path::Path, rows: &[Row]) -> Result<()> {
    let text: String = rows
        .iter()
        .map(|r| serde_json::to_string(r).map(|s| s + "\n"))
        .collect::<Result<_, _>>()?;
    grpo_conformance::atomic_file::replace(path, text.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// What the bench is timing now, for the watchdog.
struct Current {
    /// `implementation on case`, and since when.
    what: Option<(String, std::time::Instant)>,
    /// Rows measured so far.
    rows: Vec<Row>,
}

/// Stops the process when one pair runs past `limit`: prints the rows so far, writes them
/// to `json`, and exits 1 with one line naming the pair.
fn watchdog(
    state: Arc<std::sync::Mutex<Current>>,
    limit: std::time::Duration,
    json: Option<PathBuf>,
) {
    std::thread::spawn(move || loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let st = state.lock().unwrap();
        if let Some((what, t0)) = &st.what {
            if t0.elapsed() > limit {
                print_rows(&st.rows);
                if let Some(p) = &json {
                    if let Err(e) = write_json(p, &st.rows) {
                        eprintln!("error: {e:#}");
                    }
                }
                eprintln!(
                    "error: bench: {what} ran past {} s (--timeout, default the config's trial_timeout_s); the rows before it are above",
                    limit.as_secs()
                );
                std::process::exit(1);
            }
        }
    });
}

/// One measured row.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    /// Backend.
    pub backend: String,
    /// Implementation entry name.
    pub implementation: String,
    /// Case id.
    pub case: String,
    /// Timed runs, seconds.
    pub runs_s: Vec<f64>,
    /// Median run, seconds.
    pub median_s: Option<f64>,
    /// Median over jax_baseline's median on the same case in this run.
    pub over_baseline: Option<f64>,
    /// The compiler's peak, the floor and the device allocator's figures.
    pub memory: Option<grpo_conformance::backends::Memory>,
    /// The derived cost's logits-sized matmul equivalents.
    pub matmul_equivalents: Option<f64>,
    /// The roofline on the device's generation.
    pub roofline: Option<grpo_conformance::cost::roofline::Roofline>,
    /// Median / roofline.
    pub measured_over_roofline: Option<f64>,
    /// Why the cost could not be derived.
    pub cost_error: Option<String>,
    /// What the derived cost could not count (a loop's trip count, a library call).
    pub cost_notes: Vec<String>,
    /// Why the implementation did not run (unsupported, export or run error).
    pub error: Option<String>,
}

/// Runs and prints.
pub fn run(matrix: &Matrix, args: BenchArgs) -> Result<()> {
    if args.runs == 0 {
        bail!("--runs must be at least 1 (a bench with no timed run measures nothing)");
    }
    if args.timeout == Some(0) {
        bail!("--timeout must be at least 1 (seconds per implementation and case)");
    }
    if let Some(p) = &args.json {
        check_writable(p)?;
    }
    let config_path = Config::path_for(args.config.as_deref(), grpo_conformance::cases::Suite::Ci)?;
    let config = Config::load(&config_path)?;
    let cases: Vec<&Case> = matrix
        .cases
        .iter()
        .filter(|c| glob_match(&args.case, &c.id))
        .collect();
    if cases.is_empty() {
        bail!(
            "--case {}: no case id matches (list them with `grpo-suite cases --suite full`)",
            args.case
        );
    }
    let (ready, missing) =
        grpo_conformance::backends::available(&config.backends, config.export_timeout_s);
    let backend: Arc<dyn Backend> = match ready.into_iter().find(|b| b.name() == args.backend) {
        Some(b) => b,
        None => match missing.iter().find(|u| u.name == args.backend) {
            Some(u) => bail!("backend `{}` is unavailable: {}", u.name, u.reason),
            None => bail!(
                "--backend {}: {} configures no such backend",
                args.backend,
                config_path.display()
            ),
        },
    };
    if !backend.executes() {
        bail!("--backend {}: it compiles without executing; bench needs an executing backend (pjrt-cpu, pjrt-gpu, pjrt-tpu)", args.backend);
    }
    let impls =
        ordered_implementations(&backend.implementations(), args.implementations.as_deref());
    if impls.is_empty() {
        bail!(
            "--impl {}: no implementation of backend `{}` matches (it has: {})",
            args.implementations.as_deref().unwrap_or("*"),
            args.backend,
            backend.implementations().join(", ")
        );
    }
    let work: Vec<(&str, &Case)> = cases
        .iter()
        .flat_map(|c| impls.iter().map(move |i| (i.as_str(), *c)))
        .collect();
    eprintln!(
        "bench: {} implementation(s) × {} case(s) on {}, {} timed runs each: exporting",
        impls.len(),
        cases.len(),
        args.backend,
        args.runs
    );
    backend.prepare(&work)?;
    let opts = RunOptions {
        warmup: args.warmup,
        repeats: args.runs,
    };
    let limit = std::time::Duration::from_secs(args.timeout.unwrap_or(config.trial_timeout_s));
    let state = Arc::new(std::sync::Mutex::new(Current {
        what: None,
        rows: Vec::new(),
    }));
    watchdog(state.clone(), limit, args.json.clone());
    for case in &cases {
        grpo_conformance::trials::check_host_memory(case)
            .map_err(|e| anyhow::anyhow!("{}: {e}", case.id))?;
        let supported: Vec<(&String, Result<(), grpo_conformance::backends::Refusal>)> = impls
            .iter()
            .map(|i| (i, backend.supports(i, case)))
            .collect();
        let inputs = supported.iter().any(|(_, s)| s.is_ok()).then(|| {
            eprintln!("bench: {}: generating inputs", case.id);
            Inputs::generate_for_timing(case)
        });
        for (imp, support) in supported {
            let res = match (support, &inputs) {
                (Err(why), _) => Err(anyhow::anyhow!("{why}")),
                (Ok(()), Some(inputs)) => {
                    eprintln!("bench: {} on {}", imp, case.id);
                    state.lock().unwrap().what =
                        Some((format!("{imp} on {}", case.id), std::time::Instant::now()));
                    let r = backend.run(imp, case, inputs, &opts);
                    state.lock().unwrap().what = None;
                    r
                }
                (Ok(()), None) => unreachable!("inputs exist when one implementation runs"),
            };
            let row = row_of(&args.backend, imp, case, res);
            let mut st = state.lock().unwrap();
            st.rows.push(row);
            let rows = &mut st.rows;
            fill_baseline_ratios(rows);
        }
    }
    let rows = std::mem::take(&mut state.lock().unwrap().rows);
    print_rows(&rows);
    if let Some(path) = &args.json {
        write_json(path, &rows)?;
    }
    if rows.iter().all(|r| r.median_s.is_none()) {
        bail!("nothing ran: every implementation failed or was unsupported on every case");
    }
    Ok(())
}

/// The names `glob` selects, in the order of its `|` alternatives (each alternative's
/// matches in config order); all names when there is no glob.
fn ordered_implementations(names: &[String], glob: Option<&str>) -> Vec<String> {
    let Some(glob) = glob else {
        return names.to_vec();
    };
    let mut out: Vec<String> = Vec::new();
    for alt in glob.split('|') {
        for n in names.iter().filter(|n| glob_match(alt, n)) {
            if !out.contains(n) {
                out.push(n.clone());
            }
        }
    }
    out
}

fn row_of(backend: &str, imp: &str, case: &Case, res: Result<RunResult>) -> Row {
    let mut row = Row {
        backend: backend.into(),
        implementation: imp.into(),
        case: case.id.clone(),
        runs_s: Vec::new(),
        median_s: None,
        over_baseline: None,
        memory: None,
        matmul_equivalents: None,
        roofline: None,
        measured_over_roofline: None,
        cost_error: None,
        cost_notes: Vec::new(),
        error: None,
    };
    match res {
        Err(e) => row.error = Some(format!("{e:#}")),
        Ok(r) => {
            row.median_s = r.timing.as_ref().and_then(|t| t.median_s());
            row.runs_s = r.timing.map(|t| t.runs_s).unwrap_or_default();
            row.memory = r.memory;
            row.matmul_equivalents = r.derived.as_ref().and_then(|d| d.matmul_equivalents);
            row.cost_notes = r.derived.map(|d| d.notes).unwrap_or_default();
            row.roofline = r.roofline;
            row.measured_over_roofline = r.efficiency.map(|e| e.measured_over_roofline);
            row.cost_error = r.cost_error;
        }
    }
    row
}

/// Each row's median over jax_baseline's (the plain entry) on the same case.
fn fill_baseline_ratios(rows: &mut [Row]) {
    let base: Vec<(String, f64)> = rows
        .iter()
        .filter(|r| r.implementation == grpo_conformance::cost::speed::BASELINE)
        .filter_map(|r| r.median_s.map(|m| (r.case.clone(), m)))
        .collect();
    for r in rows.iter_mut() {
        if let (Some(m), Some((_, b))) = (r.median_s, base.iter().find(|(c, _)| *c == r.case)) {
            r.over_baseline = Some(m / b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn implementations_run_in_the_order_of_the_alternatives() {
        let names: Vec<String> = ["jax_baseline", "xla_chunked@a", "xla_chunked@b", "ext_ce"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            ordered_implementations(&names, Some("xla_chunked@*|jax_baseline")),
            ["xla_chunked@a", "xla_chunked@b", "jax_baseline"]
        );
        assert_eq!(ordered_implementations(&names, None), names);
        assert!(ordered_implementations(&names, Some("nothing")).is_empty());
    }
}

fn print_rows(rows: &[Row]) {
    let gb = |b: Option<u64>| b.map_or("-".into(), |b| format!("{:.2} GB", b as f64 / 1e9));
    let table: Vec<[String; 9]> = rows
        .iter()
        .map(|r| {
            let mem = r.memory.as_ref();
            [
                r.implementation.clone(),
                r.case.clone(),
                r.median_s
                    .map_or("-".into(), grpo_conformance::cost::roofline::human_time),
                r.over_baseline.map_or("-".into(), |x| format!("{x:.2}×")),
                gb(mem.and_then(|m| m.device_peak_bytes)),
                mem.and_then(|m| m.peak_over_floor())
                    .map_or("-".into(), |x| format!("{x:.2}×")),
                r.matmul_equivalents
                    .map_or("-".into(), |x| format!("{x:.2}")),
                r.roofline.as_ref().map_or("-".into(), |x| {
                    format!(
                        "{} {} ({:?})",
                        grpo_conformance::cost::roofline::human_time(x.time_s),
                        x.generation,
                        x.bound
                    )
                }),
                match (&r.error, r.measured_over_roofline) {
                    (Some(e), _) => format!("error: {e}"),
                    (None, Some(x)) => format!("{x:.2}×"),
                    (None, None) => r.cost_error.clone().unwrap_or_else(|| "-".into()),
                },
            ]
        })
        .collect();
    super::print_aligned(
        [
            "implementation",
            "case",
            "median",
            "/baseline",
            "device peak",
            "peak/floor",
            "matmuls",
            "roofline",
            "measured/roofline",
        ],
        &table,
    );
    // What the derived figures leave out, under the table (nothing when all is counted).
    for r in rows.iter().filter(|r| !r.cost_notes.is_empty()) {
        for n in &r.cost_notes {
            println!("note: {} on {}: {n}", r.implementation, r.case);
        }
    }
}
