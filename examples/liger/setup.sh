#!/usr/bin/env bash
# Builds the Liger-Kernel example's pinned environment once (.venvs/liger, from
# requirements.lock: liger-kernel 0.8.5 and torch 2.15.0 from PyPI) with grpo_torch
# installed editable; exit 3 (with the reason) when PyPI is unreachable.
exec "$(dirname "${BASH_SOURCE[0]}")/../../scripts/setup_torch.sh" liger
