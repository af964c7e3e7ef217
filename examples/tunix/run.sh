#!/usr/bin/env bash
# tunix's GRPO loss checked by config alone (docs/external.md, "A library that computes
# the whole loss"): builds the example's pinned venv once (setup.sh), then runs
# tunix_grpo.py's two entries on the ci tier (logits and fused level), next to jax_baseline.
#
#   examples/tunix/run.sh [--records FILE]                     the ci tier
#   examples/tunix/run.sh --suite nightly --filter logits/     the nightly tier's logits cases
#
# Exit status: 0 green (tunix's failures are expected failures with their causes,
# examples/tunix/grpo.yaml) or skipped with one line saying why (no Python 3.12, PyPI
# unreachable); 1 failing trials; 2 the run could not be made. scripts/nightly.sh runs it.
exec "$(dirname "${BASH_SOURCE[0]}")/../../scripts/example.sh" tunix "$@"
