#!/usr/bin/env bash
# Builds a pinned Python environment once: .venvs/NAME from LOCK and, when EDITABLE (a
# package directory of this checkout) is given, that package installed editable into it.
# Idempotent: a stamp of the lock (and EDITABLE's pyproject.toml) skips the work when
# nothing changed.
#
#   scripts/pinned_venv.sh NAME LOCK [EDITABLE]    (scripts/setup_torch.sh, scripts/setup_dashboards.sh)
#
# The interpreter: GRPO_VENV_PYTHON, else python3.11, else python3. Exit status 0 ready;
# 3 PyPI is unreachable (one line says so); anything else a failure.
set -euo pipefail
usage="usage: scripts/pinned_venv.sh NAME LOCK [EDITABLE]"
name="${1:?$usage}"
lock="${2:?$usage}"
editable="${3:-}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv=".venvs/$name"
stamp="$venv/.lock-$(cat "$lock" ${editable:+"$editable/pyproject.toml"} | sha256sum | cut -c1-16)"
[ -f "$stamp" ] && exit 0
py="${GRPO_VENV_PYTHON:-$(command -v python3.11 || command -v python3)}"
echo "[$name] creating $venv from $lock with $("$py" --version 2>&1)" >&2
rm -rf "$venv"
mkdir -p .venvs
"$py" -m venv "$venv"
pip=("$venv/bin/python" -m pip -q --disable-pip-version-check)
if ! "${pip[@]}" install -r "$lock" ${editable:+hatchling} 2>"$venv/pip.log"; then
  if grep -qiE "connection|resolve|network|timed out" "$venv/pip.log"; then
    echo "skip: $venv: PyPI is unreachable ($(grep -iE 'connection|resolve|network|timed out' "$venv/pip.log" | head -1))" >&2
    rm -rf "$venv"; exit 3
  fi
  cat "$venv/pip.log" >&2; exit 1
fi
[ -z "$editable" ] || "${pip[@]}" install --no-deps --no-build-isolation -e "$editable"
touch "$stamp"
echo "[$name] ready: $venv" >&2
