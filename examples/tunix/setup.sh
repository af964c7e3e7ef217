#!/usr/bin/env bash
# Builds the pinned Python 3.12 environment of the tunix example once (.venvs/tunix, from
# requirements.lock: google-tunix 0.1.7 from PyPI, jax 0.11.2, flax 0.12.12) with grpo_jax
# installed editable; exit 3 (with the reason) when Python 3.12 or PyPI is missing.
exec "$(dirname "${BASH_SOURCE[0]}")/../../scripts/example_venv.sh" tunix google-tunix
