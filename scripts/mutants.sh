#!/usr/bin/env bash
# Mutation testing of the judge (docs/tolerances.md, "Mutation testing"): cargo-mutants
# over src/gates and src/oracle, each mutant rebuilt with the `mutants` profile
# (opt-level 1) and checked by the unit tests of those modules (and, for the oracle,
# tests/oracle_checks.rs and the golden checks). Installs the pinned cargo-mutants once.
#
#   scripts/mutants.sh gates     # ~211 mutants, ~25 min on 2 cores
#   scripts/mutants.sh oracle    # ~840 mutants, ~1.5 h on 2 cores
#   scripts/mutants.sh roofline-identity   # src/cost/roofline.rs and src/run_identity.rs
#   scripts/mutants.sh gates --shard 0/4   # extra arguments go to cargo mutants
#
# Results: target/mutants-<set>/mutants.out/ (caught.txt, missed.txt, unviable.txt, timeout.txt).
# Exit status: cargo mutants' own (0 every mutant caught or unviable, 2 some missed).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
version=27.1.0
set_name="${1:-}"
shift || true
if ! cargo mutants --version 2>/dev/null | grep -q "$version"; then
  echo "[mutants] installing cargo-mutants $version (crates.io)" >&2
  cargo install --locked --version "$version" cargo-mutants
fi
common=(--profile mutants -j 1 --copy-target false -o "target/mutants-$set_name")
case "$set_name" in
  gates)
    exec cargo mutants -f 'src/gates/*.rs' "${common[@]}" "$@" -C --lib -- -- gates ;;
  oracle)
    # Unit tests, tests/oracle_checks.rs and, from the conformance harness, the golden
    # checks (the oracle against the stored golden files), the reference backend's trials
    # (honest naive_f32 must pass the error scales) and the should-fail variants; no
    # exported implementation (pjrt-cpu, tpu-aot).
    exec cargo mutants -f 'src/oracle/*.rs' "${common[@]}" "$@" -C --lib -C --test=oracle_checks \
      -C --test=conformance -- -- --skip inputs:: --skip pjrt-cpu/ --skip tpu-aot ;;
  roofline-identity)
    # The roofline table and model (every verdict of sweep and the speed budgets) and the
    # run identity (what --resume may reuse): their unit tests, and those of the code
    # that uses them (the cost walk, the execution backend's speed figures, tpu-aot's
    # topology sizes, the records).
    exec cargo mutants -f src/cost/roofline.rs -f src/run_identity.rs "${common[@]}" "$@" -C --lib \
      -- -- cost:: run_identity:: backends:: records:: ;;
  *)
    echo "usage: scripts/mutants.sh gates|oracle|roofline-identity [cargo mutants arguments]" >&2
    exit 2 ;;
esac
