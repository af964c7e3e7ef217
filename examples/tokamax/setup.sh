#!/usr/bin/env bash
# Builds the pinned Python 3.12 environment of the tokamax example once (.venvs/tokamax,
# from requirements.lock: tokamax 0.0.17 from PyPI, jax 0.11.2) with grpo_jax installed
# editable; exit 3 (with the reason) when Python 3.12 or PyPI is missing.
exec "$(dirname "${BASH_SOURCE[0]}")/../../scripts/example_venv.sh" tokamax tokamax
