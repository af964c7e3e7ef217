//! The expanded case matrix under review: a snapshot of the `ci` and `nightly` id lists,
//! so every change to the matrix shows up in the diff (`cargo insta review` to accept).

use grpo_conformance::cases::{load_dir, Suite};
use grpo_conformance::repo_root;

fn ids(suite: Suite) -> String {
    let m = load_dir(&repo_root().join("cases")).unwrap();
    m.suite(suite)
        .iter()
        .map(|c| c.id.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn ci_ids() {
    insta::assert_snapshot!(ids(Suite::Ci));
}

#[test]
fn nightly_ids() {
    insta::assert_snapshot!(ids(Suite::Nightly));
}

#[test]
fn smoke_is_inside_ci_and_every_case_has_a_golden_file() {
    let m = load_dir(&repo_root().join("cases")).unwrap();
    let ci: Vec<_> = m.suite(Suite::Ci).iter().map(|c| c.id.clone()).collect();
    for c in m.suite(Suite::Smoke) {
        assert!(ci.contains(&c.id), "smoke case {} is not in ci", c.id);
    }
    for c in m.suite(Suite::Ci).into_iter().filter(|c| !c.compile_only) {
        let p = grpo_conformance::golden::path(&repo_root().join("golden"), c);
        assert!(
            p.is_file(),
            "no golden file for {} (run `cargo run --release -- golden update`)",
            c.id
        );
    }
    let orphans =
        grpo_conformance::golden::orphans(&repo_root().join("golden"), &m.suite(Suite::Full));
    assert!(orphans.is_empty(), "golden files of no case: {orphans:?}");
}

#[test]
fn required_shapes_are_in_the_matrix() {
    let m = load_dir(&repo_root().join("cases")).unwrap();
    for v in [151936, 151643, 2049, 32001] {
        assert!(
            m.suite(Suite::Ci).iter().any(|c| c.shape.v == v),
            "ci has no V={v}"
        );
    }
    assert!(m
        .suite(Suite::Nightly)
        .iter()
        .any(|c| c.shape.v == 151936 && c.shape.t == 8192));
}
