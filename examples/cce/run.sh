#!/usr/bin/env bash
# Apple's Cut Cross-Entropy (`linear_cross_entropy`, reduction="none") as a fused logp
# function, checked by config alone (docs/external.md, "Cut Cross-Entropy"): builds the
# example's pinned venv once (setup.sh), then runs cce_grpo.py's entry on the ci tier next
# to torch_baseline, on the torch backend (cpu: CCE's torch_compile implementation).
#
#   examples/cce/run.sh [--records FILE]
#
# Exit status: 0 green (CCE's failures are expected failures with their causes,
# examples/cce/grpo.yaml) or skipped with one line saying why (PyPI unreachable);
# 1 failing trials; 2 the run could not be made.
exec "$(dirname "${BASH_SOURCE[0]}")/../../scripts/example.sh" cce "$@"
