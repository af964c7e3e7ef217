#!/usr/bin/env bash
# Builds the pinned environment of `grpo-suite export` once (.venvs/dashboards, from
# scripts/dashboards.lock, with the suite's Python 3.11): the W&B SDK, tensorboardX and
# tbparse. Idempotent: a stamp of the lock skips the work when nothing changed. About
# 360 MB installed (2026-12-05).
#
# Exit status 0 ready; 3 PyPI is unreachable (one line says so); anything else a failure.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv=".venvs/dashboards"
lock="scripts/dashboards.lock"
stamp="$venv/.lock-$(sha256sum "$lock" | cut -c1-16)"
[ -f "$stamp" ] && exit 0
py="$(command -v python3.11 || command -v python3)"
echo "[dashboards] creating $venv from $lock with $("$py" --version 2>&1)" >&2
rm -rf "$venv"
mkdir -p .venvs
"$py" -m venv "$venv"
if ! "$venv/bin/python" -m pip -q --disable-pip-version-check install -r "$lock" 2>"$venv/pip.log"; then
  if grep -qiE "connection|resolve|network|timed out" "$venv/pip.log"; then
    echo "skip: $venv: PyPI is unreachable ($(grep -iE 'connection|resolve|network|timed out' "$venv/pip.log" | head -1))" >&2
    rm -rf "$venv"; exit 3
  fi
  cat "$venv/pip.log" >&2; exit 1
fi
touch "$stamp"
echo "[dashboards] ready: wandb $("$venv/bin/python" -c 'import wandb; print(wandb.__version__)')" >&2
