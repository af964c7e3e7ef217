#!/usr/bin/env bash
# README command 2 (and what .ci/run calls): set up everything (idempotent), then run
# every test: the Python package's pytest suite, then `cargo test` over the workspace
# (unit tests, oracle self-checks, the PJRT binding against the real CPU plugin, and the
# conformance harness over the `ci` tier). Both default backends are required: if one
# is unavailable the run fails instead of ignoring its trials.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
echo "== pytest backends/jax" >&2
.venv/bin/python -m pytest -q -p no:cacheprovider backends/jax/tests
echo "== cargo test" >&2
export GRPO_REQUIRE_BACKENDS="${GRPO_REQUIRE_BACKENDS:-reference,pjrt-cpu}"
exec cargo test --workspace --release "$@"
