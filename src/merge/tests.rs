use super::*;
use crate::outcome::TrialKind;
use crate::partition::{Assigned, Partition};

/// Writes shard `index`/`count` of plan `plan` to `dir/<file>`: its stamp assigning
/// `assigned`, and a record line for each of `recorded`.
fn shard(
    dir: &Path,
    file: &str,
    index: usize,
    count: usize,
    plan: &str,
    assigned: &[&str],
    recorded: &[&str],
) -> PathBuf {
    shard_of_run(dir, file, index, count, plan, assigned, recorded, None)
}

#[allow(clippy::too_many_arguments)]
fn shard_of_run(
    dir: &Path,
    file: &str,
    index: usize,
    count: usize,
    plan: &str,
    assigned: &[&str],
    recorded: &[&str],
    run_id: Option<&str>,
) -> PathBuf {
    let path = dir.join(file);
    let stamp = ShardStamp {
        plan_digest: plan.into(),
        partition: Partition { index, count },
        weights_digest: "estimate".into(),
        config_digest: "xxh3:c".into(),
        suite: "ci".into(),
        assigned: assigned
            .iter()
            .map(|n| Assigned {
                name: n.to_string(),
                kind: TrialKind::Run,
                key: ("pjrt-cpu".into(), "jax_baseline".into(), n.to_string()),
            })
            .collect(),
        run_id: run_id.map(String::from),
    };
    stamp.write(&path).unwrap();
    let mut text = String::new();
    for n in recorded {
        let mut o = TrialOutcome::new(n.to_string(), TrialKind::Run, "pjrt-cpu", "jax_baseline", n);
        o.wall_s = 1.0;
        let mut m = match serde_json::to_value(&o).unwrap() {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        m.insert("suite".into(), "ci".into());
        m.insert("config_digest".into(), "xxh3:c".into());
        m.insert("code_digest".into(), "xxh3:k".into());
        m.insert("shard".into(), serde_json::to_value(stamp.line()).unwrap());
        text.push_str(&serde_json::to_string(&m).unwrap());
        text.push('\n');
    }
    std::fs::write(&path, text).unwrap();
    path
}

fn refused(out: &Path, files: &[PathBuf]) -> String {
    let e = merge(out, files, false).unwrap_err().to_string();
    assert!(!e.contains('\n'), "{e}");
    e
}

#[test]
fn complete_shards_merge_into_one_run_without_their_stamps() {
    let d = tempfile::tempdir().unwrap();
    let a = shard(d.path(), "1.jsonl", 1, 2, "p", &["a", "b"], &["a", "b"]);
    let b = shard(d.path(), "2.jsonl", 2, 2, "p", &["c"], &["c"]);
    let out = d.path().join("all.jsonl");
    let m = merge(
        &out,
        &shard_files(&[d.path().to_path_buf()]).unwrap(),
        false,
    )
    .unwrap();
    assert_eq!((m.shards, m.lines), (2, 3));
    let back = crate::records::read(&out).unwrap();
    let names: Vec<&str> = back.outcomes.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert!(!std::fs::read_to_string(&out).unwrap().contains("\"shard\""));
    // The same files named one by one.
    merge(&out, &[a, b], false).unwrap();
}

#[test]
fn each_bad_input_is_refused_in_one_line_naming_the_file_and_field() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let out = p.join("out.jsonl");
    let one = shard(p, "1.jsonl", 1, 2, "p", &["a"], &["a"]);
    let two = shard(p, "2.jsonl", 2, 2, "p", &["b"], &["b"]);
    // No stamp.
    std::fs::write(p.join("bare.jsonl"), "").unwrap();
    assert!(
        refused(&out, &[one.clone(), p.join("bare.jsonl")]).contains("no shard stamp beside it")
    );
    // Another plan.
    let other = shard(p, "o.jsonl", 2, 2, "q", &["b"], &["b"]);
    let e = refused(&out, &[one.clone(), other]);
    assert!(
        e.contains("o.jsonl") && e.contains("field `plan_digest`"),
        "{e}"
    );
    // Another count.
    let three = shard(p, "t.jsonl", 2, 3, "p", &["b"], &["b"]);
    assert!(refused(&out, &[one.clone(), three]).contains("field `partition`"));
    // An index twice, an index missing.
    let again = shard(p, "again.jsonl", 1, 2, "p", &["a"], &["a"]);
    assert!(refused(&out, &[one.clone(), again]).contains("a shard given twice"));
    assert!(refused(&out, &[one.clone()]).contains("shard 2/2 missing"));
    // A trial in two shards; a trial outside its shard's assignment.
    let dup = shard(p, "dup.jsonl", 2, 2, "p", &["a", "b"], &["a", "b"]);
    let e = refused(&out, &[one.clone(), dup]);
    assert!(e.contains("trial `a` is in shard 2/2 and in"), "{e}");
    let stray = shard(p, "stray.jsonl", 2, 2, "p", &["b"], &["b", "z"]);
    let e = refused(&out, &[one.clone(), stray]);
    assert!(
        e.contains("stray.jsonl:2") && e.contains("trial `z` is not assigned to shard 2/2"),
        "{e}"
    );
    // A line of another shard pasted in (its `shard` field disagrees with the stamp).
    let mut text = std::fs::read_to_string(&two).unwrap();
    text.push_str(&std::fs::read_to_string(&one).unwrap());
    let mixed = p.join("mixed.jsonl");
    std::fs::write(&mixed, text).unwrap();
    std::fs::copy(ShardStamp::path_for(&two), ShardStamp::path_for(&mixed)).unwrap();
    let e = refused(&out, &[one.clone(), mixed]);
    assert!(e.contains("mixed.jsonl:2: field `shard` is 1/2"), "{e}");
    // The output among the inputs.
    assert!(refused(&one, &[one.clone(), two.clone()]).contains("the output is one of the shards"));
}

#[test]
fn an_assigned_trial_without_a_record_is_refused_or_an_error_line() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let one = shard(p, "1.jsonl", 1, 2, "p", &["a", "b"], &["a"]);
    let two = shard(p, "2.jsonl", 2, 2, "p", &["c"], &["c"]);
    let out = p.join("out.jsonl");
    let e = refused(&out, &[one.clone(), two.clone()]);
    assert!(
        e.contains("1 assigned trial has no record (first: b (1/2))"),
        "{e}"
    );
    let m = merge(&out, &[one, two], true).unwrap();
    assert_eq!(m.missing.len(), 1);
    let back = crate::records::read(&out).unwrap();
    let b = back.outcomes.iter().find(|o| o.name == "b").unwrap();
    assert!(
        matches!(&b.verdict, Verdict::Error(m) if m.contains("shard 1/2 left no record")),
        "{:?}",
        b.verdict
    );
    // It carries the run's identity, so --resume of the merged file accepts it.
    let ids = crate::run_identity::read(&out).unwrap();
    assert!(ids
        .iter()
        .all(|(_, r)| r.config_digest.as_deref() == Some("xxh3:c")));
    assert!(ids
        .iter()
        .all(|(_, r)| r.code_digest.as_deref() == Some("xxh3:k")));
}

/// Record lines of an unsplit run, one file (a cargo-nextest process's), no stamp.
fn piece(dir: &Path, file: &str, config: &str, recorded: &[(&str, u64, &str)]) -> PathBuf {
    let path = dir.join(file);
    let mut text = String::new();
    for (n, t, verdict) in recorded {
        let mut o = TrialOutcome::new(n.to_string(), TrialKind::Run, "pjrt-cpu", "jax_baseline", n);
        if *verdict == "error" {
            o.verdict = Verdict::Error("flaky".into());
        }
        let mut m = match serde_json::to_value(&o).unwrap() {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        m.insert("suite".into(), "smoke".into());
        m.insert("config_digest".into(), config.into());
        m.insert("unix_time".into(), (*t).into());
        text.push_str(&serde_json::to_string(&m).unwrap());
        text.push('\n');
    }
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_nextest_runs_pieces_merge_into_one_run_keeping_a_retried_trials_last_record() {
    let d = tempfile::tempdir().unwrap();
    let run = d.path().join("nextest-run");
    std::fs::create_dir(&run).unwrap();
    piece(&run, "a.jsonl", "xxh3:c", &[("x", 10, "error")]);
    piece(&run, "b.jsonl", "xxh3:c", &[("x", 20, "pass")]);
    piece(&run, "c.jsonl", "xxh3:c", &[("y", 15, "pass")]);
    let out = d.path().join("all.jsonl");
    let m = merge(&out, &shard_files(&[run.clone()]).unwrap(), false).unwrap();
    assert_eq!(m.lines, 2);
    let back = crate::records::read(&out).unwrap().outcomes;
    let x = back.iter().find(|o| o.name == "x").unwrap();
    assert_eq!(x.verdict, Verdict::Pass, "the retry's record wins");
    // A piece of another run (another configuration) is refused.
    piece(&run, "d.jsonl", "xxh3:other", &[("z", 30, "pass")]);
    let e = merge(&out, &shard_files(&[run]).unwrap(), false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("d.jsonl:1: field `config_digest`"), "{e}");
}

#[test]
fn the_pieces_of_one_shard_from_one_nextest_run_are_one_shard() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let a = shard_of_run(p, "1a.jsonl", 1, 2, "p", &["a", "b"], &["a"], Some("run-1"));
    let b = shard_of_run(p, "1b.jsonl", 1, 2, "p", &["a", "b"], &["b"], Some("run-1"));
    let c = shard_of_run(p, "2.jsonl", 2, 2, "p", &["c"], &["c"], Some("run-1"));
    let out = p.join("out.jsonl");
    assert_eq!(
        merge(&out, &[a.clone(), b, c.clone()], false)
            .unwrap()
            .lines,
        3
    );
    // Another run's piece of shard 1 is a shard given twice.
    let other = shard_of_run(p, "1x.jsonl", 1, 2, "p", &["a", "b"], &["b"], Some("run-2"));
    assert!(refused(&out, &[a, other, c]).contains("a shard given twice"));
}

/// `path`'s record lines with `key` set to `value` (the stamp left as it is).
fn with_field(path: &Path, key: &str, value: Value) {
    let text: String = std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            let mut m: Map<String, Value> = serde_json::from_str(l).unwrap();
            m.insert(key.into(), value.clone());
            serde_json::to_string(&m).unwrap() + "\n"
        })
        .collect();
    std::fs::write(path, text).unwrap();
}

/// Shards of one split that differ in the run's identity (what a CI matrix whose jobs
/// check out a moving branch gives) are refused, naming the shard and the field: the
/// tolerance scale, XLA:CPU's settings, an implementation's code digest, the
/// configuration.
#[test]
fn shards_that_differ_in_the_runs_identity_are_refused_naming_the_shard_and_field() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let out = p.join("out.jsonl");
    for (key, value, words) in [
        ("tol_scale", Value::from(0.5), "field `tol_scale` is 0.5"),
        (
            "xla_cpu",
            Value::from("opt_level=0 fusion_emitters=0"),
            "field `xla_cpu`",
        ),
        (
            "code_digest",
            Value::from("xxh3:edited"),
            "field `code_digest` of implementation `jax_baseline`",
        ),
        (
            "config_digest",
            Value::from("xxh3:other"),
            "field `config_digest`",
        ),
    ] {
        let one = shard(p, "1.jsonl", 1, 2, "p", &["a"], &["a"]);
        let two = shard(p, "2.jsonl", 2, 2, "p", &["b"], &["b"]);
        with_field(&two, key, value);
        let e = refused(&out, &[one, two]);
        assert!(e.contains("2.jsonl:1") && e.contains(words), "{key}: {e}");
    }
    // The stamp's configuration too (the stamps of two configurations' shards).
    let one = shard(p, "1.jsonl", 1, 2, "p", &["a"], &["a"]);
    let two = shard(p, "2.jsonl", 2, 2, "p", &["b"], &["b"]);
    let mut stamp = ShardStamp::read(&two).unwrap();
    stamp.config_digest = "xxh3:other".into();
    stamp.write(&two).unwrap();
    let e = refused(&out, &[one, two]);
    assert!(e.contains("field `config_digest`"), "{e}");
}

/// The output named another way than an input is still that input; a line that is not a
/// trial record is refused; a shard with no trial (a split wider than the plan) merges;
/// a shard's records without their stamp say the stamp is missing.
#[test]
fn merge_refuses_its_input_as_output_and_non_records_and_takes_an_empty_shard() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path();
    let one = shard(p, "1.jsonl", 1, 3, "p", &["a"], &["a"]);
    let two = shard(p, "2.jsonl", 2, 3, "p", &["b"], &["b"]);
    let empty = shard(p, "3.jsonl", 3, 3, "p", &[], &[]);
    let dotted = p.join(".").join("1.jsonl");
    let e = refused(&dotted, &[one.clone(), two.clone(), empty.clone()]);
    assert!(e.contains("the output is one of the shards"), "{e}");
    let out = p.join("out.jsonl");
    let m = merge(&out, &[one.clone(), two.clone(), empty.clone()], false).unwrap();
    assert_eq!((m.shards, m.lines), (3, 2));
    let bad = p.join("bad.jsonl");
    std::fs::copy(&two, &bad).unwrap();
    std::fs::copy(ShardStamp::path_for(&two), ShardStamp::path_for(&bad)).unwrap();
    std::fs::write(&bad, "{\"name\": 3}\n").unwrap();
    let e = refused(&out, &[one.clone(), bad, empty]);
    assert!(e.contains("bad.jsonl:1: not a trial record"), "{e}");
    let lost = p.join("lost.jsonl");
    std::fs::copy(&one, &lost).unwrap();
    let e = refused(&p.join("o2.jsonl"), &[lost]);
    assert!(
        e.contains("lost.jsonl:1") && e.contains("stamp is missing"),
        "{e}"
    );
}
