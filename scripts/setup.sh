#!/usr/bin/env bash
# Idempotent set-up of everything the suite needs on a fresh Debian machine:
# Debian packages, the pinned Python venv (.venv) with jax, the PJRT CPU plugin and libtpu
# (the TPU compiler of the tpu-aot backend; requirements.lock pins it).
# Safe to run again: each step checks first and does nothing when already done.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

say() { printf '[setup] %s\n' "$*" >&2; }

# 1. Debian packages (libclang for bindgen of the PJRT C API header).
apt_pkgs=(libclang-dev python3-venv)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  # apt's "debconf: delaying package configuration" is noise on a machine without apt-utils.
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" \
    >/dev/null 2> >(grep -v '^debconf: delaying package configuration' >&2)
fi

# 2. Python venv pinned by backends/jax/requirements.lock.
py="${GRPO_PYTHON:-python3.11}"
command -v "$py" >/dev/null 2>&1 || py=python3
lock="backends/jax/requirements.lock"
stamp=".venv/.lock-$(sha256sum "$lock" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  say "creating .venv from $lock with $($py --version 2>&1)"
  [ -x .venv/bin/python ] || "$py" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check -r "$lock"
  if [ -f backends/jax/pyproject.toml ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps \
      --no-build-isolation -e backends/jax
  fi
  rm -f .venv/.lock-*
  touch "$stamp"
fi
# 3. pjrt-gpu, only where an NVIDIA driver is present: the CUDA 13 PJRT plugin and CUDA
# libraries of the pinned jax (jax[cuda13]; docs/gpu.md says why CUDA 13). Elsewhere the
# backend is unavailable and its trials are listed as ignored.
if [ -e /dev/nvidia0 ] || [ -e /proc/driver/nvidia/version ]; then
  jaxv="$(grep -E '^jax==' "$lock" | cut -d= -f3)"
  if ! .venv/bin/python -c "import jax_plugins.xla_cuda13" >/dev/null 2>&1; then
    say "NVIDIA driver found: installing jax[cuda13]==$jaxv (the CUDA PJRT plugin of pjrt-gpu)"
    .venv/bin/python -m pip install -q --disable-pip-version-check "jax[cuda13]==$jaxv"
  fi
fi
say "ready: $(.venv/bin/python -c 'import jax; print("jax", jax.__version__)')"
