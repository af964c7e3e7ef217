#!/usr/bin/env bash
# Builds the torch backend's pinned environment once (.venvs/torch, from
# backends/torch/requirements.lock, with the suite's Python 3.11) and installs this
# checkout's grpo_torch into it, editable; or, given NAME, a torch example's own
# (.venvs/NAME from examples/NAME/requirements.lock: examples/liger/setup.sh).
#
#   scripts/setup_torch.sh [NAME]
# Idempotent: a stamp of the lock file skips the
# work when nothing changed. PyPI's torch wheel brings its CUDA wheels even on a CPU
# machine (it needs them to import): about 5.4 GB installed, 37 s here with pip's cache
# warm (2026-12-05).
#
# Exit status 0 ready; 3 PyPI is unreachable (one line says so); anything else a failure.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
name="${1:-torch}"
venv=".venvs/$name"
lock="backends/torch/requirements.lock"
[ "$name" = torch ] || lock="examples/$name/requirements.lock"
stamp="$venv/.lock-$(cat "$lock" backends/torch/pyproject.toml | sha256sum | cut -c1-16)"
[ -f "$stamp" ] && exit 0
py="${GRPO_TORCH_PYTHON:-$(command -v python3.11 || command -v python3)}"
echo "[$name] creating $venv from $lock with $("$py" --version 2>&1)" >&2
rm -rf "$venv"
mkdir -p .venvs
"$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
if ! "${pip[@]}" install -r "$lock" hatchling 2>"$venv/pip.log"; then
  if grep -qiE "connection|resolve|network|timed out" "$venv/pip.log"; then
    echo "skip: $venv: PyPI is unreachable ($(grep -iE 'connection|resolve|network|timed out' "$venv/pip.log" | head -1))" >&2
    rm -rf "$venv"; exit 3
  fi
  cat "$venv/pip.log" >&2; exit 1
fi
"${pip[@]}" install --no-deps --no-build-isolation -e backends/torch
touch "$stamp"
echo "[$name] ready: torch $("$venv/bin/python" -c 'import torch; print(torch.__version__)')" >&2
