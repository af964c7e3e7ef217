#!/usr/bin/env bash
# Builds the pinned environment of `grpo-suite export` once (.venvs/dashboards, from
# scripts/dashboards.lock, with the suite's Python 3.11): the W&B SDK, tensorboardX and
# tbparse. Idempotent (scripts/pinned_venv.sh). About 360 MB installed (2026-12-05).
# Exit status 0 ready; 3 PyPI is unreachable; anything else a failure.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/pinned_venv.sh" dashboards scripts/dashboards.lock
