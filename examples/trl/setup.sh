#!/usr/bin/env bash
# Builds the TRL example's pinned environment once (.venvs/trl, from requirements.lock:
# trl 1.16.0 and torch 2.15.0 from PyPI) with grpo_torch installed editable; exit 3 (with
# the reason) when PyPI is unreachable.
exec "$(dirname "${BASH_SOURCE[0]}")/../../scripts/setup_torch.sh" trl
