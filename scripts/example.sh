#!/usr/bin/env bash
# One example checked by config alone (docs/external.md): builds its pinned venv once
# (examples/NAME/setup.sh), then runs the suite with examples/NAME/grpo.yaml.
#
#   scripts/example.sh NAME [grpo-suite run options...]   (default --suite ci)
#
# Exit status: 0 green (the example's known failures are expected failures in its
# grpo.yaml) or skipped with one line saying why (no Python 3.12, PyPI unreachable);
# 1 failing trials; 2 the run could not be made. scripts/nightly.sh runs the examples.
set -uo pipefail
name="${1:?usage: scripts/example.sh NAME [grpo-suite run options...]}"
shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
"examples/$name/setup.sh"
rc=$?
[ "$rc" -eq 3 ] && exit 0   # skipped; setup.sh said why
[ "$rc" -eq 0 ] || exit 2
cargo build --release --quiet || exit 2
suite=(--suite ci)
for a in "$@"; do [ "$a" = "--suite" ] && suite=(); done
# The examples' newer CPU plugin warns about Shardy attributes of every multi-device
# module (harmless: "Disabling HloShardingV3"); keep XLA's errors only.
TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}" target/release/grpo-suite run "${suite[@]}" \
  --config "examples/$name/grpo.yaml" "$@"
rc=$?
[ "$rc" -le 1 ] && exit "$rc"
exit 2   # 2: configuration or usage error, 3: nothing checked
