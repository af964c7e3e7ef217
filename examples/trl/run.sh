#!/usr/bin/env bash
# TRL 1.16.0's GRPO loss (GRPOTrainer._compute_loss) checked by config alone (docs/external.md,
# "TRL"): builds the example's pinned venv once (setup.sh), then runs
# trl_grpo.py's entry on the ci tier next to torch_baseline, on the torch backend (cpu).
#
#   examples/trl/run.sh [--records FILE]
#
# Exit status: 0 green (TRL's failures are expected failures with their causes,
# examples/trl/grpo.yaml) or skipped with one line saying why (PyPI unreachable);
# 1 failing trials; 2 the run could not be made.
exec "$(dirname "${BASH_SOURCE[0]}")/../../scripts/example.sh" trl "$@"
