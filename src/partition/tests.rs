use super::*;
use crate::cases::{load_dir, Suite};
use crate::trials::Target;
use std::sync::Arc;

#[test]
fn a_partition_is_i_of_n_one_based() {
    assert_eq!(
        "2/8".parse::<Partition>(),
        Ok(Partition { index: 2, count: 8 })
    );
    assert_eq!("1/1".parse::<Partition>().unwrap().to_string(), "1/1");
    for bad in ["0/8", "9/8", "8", "a/b", "1/0", "", "1/2/3"] {
        let e = bad.parse::<Partition>().unwrap_err();
        assert!(e.contains("must be I/N"), "{bad}: {e}");
    }
}

/// Trials as a plan names them, over the ci matrix: each case on three backends (one
/// compile-only, one not available here: they weigh the same) and its golden check.
fn ci_trials() -> Vec<Trial> {
    let m = load_dir(&crate::repo_root().join("cases")).unwrap();
    let mut out = Vec::new();
    for c in m.suite(Suite::Ci) {
        let c = Arc::new(c.clone());
        for b in ["reference", "pjrt-cpu", "pjrt-gpu", "tpu-aot-v6e-2x2"] {
            out.push(Trial {
                name: format!("{b}/x/{}", c.id),
                key: (b.into(), "x".into(), c.id.clone()),
                work: Work::Run {
                    target: Target::Unavailable {
                        reason: String::new(),
                        required: false,
                        broken: false,
                    },
                    implementation: "x".into(),
                    case: c.clone(),
                    expected: Vec::new(),
                },
            });
        }
        out.push(Trial {
            name: format!("golden/{}", c.id),
            key: ("golden".into(), "oracle".into(), c.id.clone()),
            work: Work::Golden(c.clone()),
        });
    }
    out
}

/// A case id without its multi-device suffix (`…/d4-batch` → `…`).
fn base_case(id: &str) -> &str {
    match id.rsplit_once('/') {
        Some((base, last))
            if last.starts_with('d')
                && last[1..].split_once('-').is_some_and(|(n, s)| {
                    n.chars().all(|c| c.is_ascii_digit()) && ["batch", "vocab"].contains(&s)
                }) =>
        {
            base
        }
        _ => id,
    }
}

#[test]
fn every_trial_is_in_one_shard_with_its_case_and_the_split_is_deterministic() {
    let trials = ci_trials();
    let a = Assignment::of(&trials, 4, None);
    let b = Assignment::of(&trials, 4, None);
    assert_eq!(a.shard_of, b.shard_of);
    let mut by_unit: HashMap<String, usize> = HashMap::new();
    for t in &trials {
        let shards: Vec<usize> = (1..=4).filter(|&i| a.keeps(t, i)).collect();
        assert_eq!(shards.len(), 1, "{}", t.name);
        // A multi-device variant goes with its base case (one oracle): grouped by the id
        // read off the trial's case (its `/d<N>-<sharding>` suffix cut), not by `unit_of`.
        let s = *by_unit
            .entry(base_case(&t.key.2).to_string())
            .or_insert(shards[0]);
        assert_eq!(s, shards[0], "{} split from its base case", t.name);
    }
    assert!(trials
        .iter()
        .any(|t| t.name.contains("/d4-") && a.keeps(t, a.shard_of[&unit_of(t)])));
    // Balanced: longest first to the least loaded shard.
    let mean = a.loads.iter().sum::<f64>() / 4.0;
    let most = a.loads.iter().cloned().fold(0.0, f64::max);
    let biggest_unit = a.units.values().cloned().fold(0.0, f64::max);
    assert!(most <= (1.25 * mean).max(biggest_unit), "{:?}", a.loads);
}

#[test]
fn measured_weights_decide_the_split() {
    let trials = ci_trials();
    let est = Assignment::of(&trials, 2, None);
    // Every trial 1 s but one case's, which takes as long as all the others together:
    // it is alone in its shard.
    let heavy = unit_of(&trials[0]);
    let n = trials.len() as f64;
    let w = Weights {
        seconds: trials
            .iter()
            .map(|t| (t.name.clone(), if unit_of(t) == heavy { n } else { 1.0 }))
            .collect(),
        digest: "xxh3:test".into(),
    };
    let m = Assignment::of(&trials, 2, Some(&w));
    let s = m.shard_of[&heavy];
    assert!(trials
        .iter()
        .all(|t| (unit_of(t) == heavy) == m.keeps(t, s)));
    assert_ne!(est.loads, m.loads);
}

#[test]
fn a_shard_stamp_is_written_beside_its_records_and_read_back() {
    let d = tempfile::tempdir().unwrap();
    let rec = d.path().join("s1.jsonl");
    let st = ShardStamp {
        plan_digest: plan_digest(&["a".into(), "b".into()]),
        partition: Partition { index: 1, count: 2 },
        weights_digest: "estimate".into(),
        config_digest: "xxh3:c".into(),
        suite: "ci".into(),
        assigned: vec![Assigned {
            name: "a".into(),
            kind: crate::outcome::TrialKind::Run,
            key: ("b".into(), "i".into(), "c".into()),
        }],
        run_id: None,
    };
    st.write(&rec).unwrap();
    assert_eq!(ShardStamp::read(&rec).unwrap(), st);
    let e = ShardStamp::read(&d.path().join("other.jsonl"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no shard stamp beside it"), "{e}");
}
