#!/usr/bin/env bash
# Liger-Kernel's LigerFusedLinearGRPOLoss checked by config alone (docs/external.md,
# "Liger-Kernel"): builds the example's pinned venv once (setup.sh), then runs
# liger_grpo.py's entry on the ci tier next to torch_baseline, on the torch backend (cpu).
#
#   examples/liger/run.sh [--records FILE]
#
# Exit status: 0 green (Liger's failures are expected failures with their causes,
# examples/liger/grpo.yaml) or skipped with one line saying why (PyPI unreachable);
# 1 failing trials; 2 the run could not be made.
exec "$(dirname "${BASH_SOURCE[0]}")/../../scripts/example.sh" liger "$@"
