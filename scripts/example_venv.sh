#!/usr/bin/env bash
# Builds the pinned Python 3.12 environment of one example once (.venvs/NAME, from
# examples/NAME/requirements.lock) and installs the suite's grpo_jax into it, editable
# (hatchling builds out of tree: the checkout stays unchanged), so it always exports this
# checkout's sources. Idempotent: a stamp of the lock file skips the work when nothing
# changed.
#
#   scripts/example_venv.sh NAME PYPI_PACKAGE      (examples/tokamax/setup.sh, examples/tunix/setup.sh)
#
# The interpreter: GRPO_EXAMPLE_PYTHON, else python3.12 on PATH, else pyenv's 3.12 (a pyenv
# version need not be global). Exit status 0 ready; 3 PyPI is unreachable or no Python
# 3.12 (the one line says which: scripts/nightly.sh then skips the example with that
# reason); anything else a failure.
set -euo pipefail
name="${1:?usage: scripts/example_venv.sh NAME PYPI_PACKAGE}"
package="${2:?usage: scripts/example_venv.sh NAME PYPI_PACKAGE}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv=".venvs/$name"
lock="examples/$name/requirements.lock"
stamp="$venv/.lock-$(cat "$lock" backends/jax/pyproject.toml | sha256sum | cut -c1-16)"
# grpo_jax is installed editable (a .pth entry for backends/jax), so the venv exports this
# checkout's sources as they are; a venv made with a copy of them is switched over once.
editable() {
  "$venv/bin/python" -c 'import importlib.util as u, os, sys; sys.exit(os.path.realpath(list(u.find_spec("grpo_jax").submodule_search_locations)[0]) != os.path.realpath("backends/jax/grpo_jax"))' 2>/dev/null
}
install_grpo_jax() {
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e backends/jax
}
if [ -f "$stamp" ]; then
  editable || install_grpo_jax
  exit 0
fi
py="${GRPO_EXAMPLE_PYTHON:-}"
if [ -z "$py" ]; then
  for c in python3.12 "$(pyenv root 2>/dev/null)/versions/"3.12*/bin/python; do
    if [ -x "$(command -v "$c" 2>/dev/null || echo "$c")" ] && "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      py="$c"; break
    fi
  done
fi
if [ -z "$py" ]; then
  echo "skip: examples/$name needs Python 3.12 (its lock is pinned for it): none found (python3.12, pyenv's versions); set GRPO_EXAMPLE_PYTHON" >&2
  exit 3
fi
if ! "$py" -c "import urllib.request; urllib.request.urlopen('https://pypi.org/simple/$package/', timeout=15)" 2>/dev/null; then
  echo "skip: examples/$name: PyPI (https://pypi.org/simple/$package/) is unreachable; the example's venv cannot be built" >&2
  exit 3
fi
echo "[$name] creating $venv from $lock with $("$py" --version 2>&1) ($py)" >&2
rm -rf "$venv"
"$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$lock"
install_grpo_jax
touch "$stamp"
