#!/usr/bin/env bash
# Builds the torch backend's pinned environment once (.venvs/torch, from
# backends/torch/requirements.lock, with the suite's Python 3.11, or GRPO_TORCH_PYTHON)
# and installs this checkout's grpo_torch into it, editable; or, given NAME, a torch
# example's own (.venvs/NAME from examples/NAME/requirements.lock: examples/liger/setup.sh).
#
#   scripts/setup_torch.sh [NAME]
#
# Idempotent (scripts/pinned_venv.sh). PyPI's torch wheel brings its CUDA wheels even on
# a CPU machine (it needs them to import): about 5.4 GB installed, 37 s here with pip's
# cache warm (2026-12-05). Exit status 0 ready; 3 PyPI is unreachable; else a failure.
set -euo pipefail
here="$(dirname "${BASH_SOURCE[0]}")"
name="${1:-torch}"
lock="backends/torch/requirements.lock"
[ "$name" = torch ] || lock="examples/$name/requirements.lock"
GRPO_VENV_PYTHON="${GRPO_TORCH_PYTHON:-}" exec bash "$here/pinned_venv.sh" "$name" "$lock" backends/torch
