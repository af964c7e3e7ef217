#!/usr/bin/env bash
# Builds the Cut Cross-Entropy example's pinned environment once (.venvs/cce, from
# requirements.lock: cut-cross-entropy 25.1.1 and torch 2.15.0 from PyPI) with grpo_torch
# installed editable; exit 3 (with the reason) when PyPI is unreachable.
exec "$(dirname "${BASH_SOURCE[0]}")/../../scripts/setup_torch.sh" cce
