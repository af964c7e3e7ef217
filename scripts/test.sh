#!/usr/bin/env bash
# README command 2 (and what .ci/run calls): set up everything (idempotent), then run
# every test: the Python package's pytest suite, then `cargo test` over the workspace
# (unit tests, oracle self-checks, the PJRT binding against the real CPU plugin, the
# conformance harness over the `ci` tier, doc tests), then the harness once more with
# configs/tpu.yaml and configs/gpu.yaml (their pjrt-tpu and pjrt-gpu trials are listed
# as ignored without chips or a GPU). Both
# default backends are required: if one is unavailable the run fails instead of ignoring
# its trials. Each step says how long it took; the run ends with one summary line over
# both runners.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# Seconds since the last step, printed when a step ends.
step_start=$SECONDS
bash scripts/setup.sh || exit 1
took() { echo "   ($1: $((SECONDS - step_start)) s)" >&2; step_start=$SECONDS; }
took "setup"
# The torch backend's environment (.venvs/torch: torch and its CUDA wheels, about 5.4 GB)
# downloads while pytest and the build below use the cores; it is waited for before the
# tests that use it (tests/torch.rs, the configs/torch.yaml run).
torchlog="$(mktemp)"
# The dashboards' environment (.venvs/dashboards: wandb, tensorboardX, tbparse; about
# 360 MB) comes after it, for tests/export.rs.
{ bash scripts/setup_torch.sh && bash scripts/setup_dashboards.sh; } >"$torchlog" 2>&1 &
torchpid=$!
log="$(mktemp)"
pylog="$(mktemp)"
pypid=""
trap '[ -n "$pypid" ] && kill "$pypid" 2>/dev/null; kill "$torchpid" 2>/dev/null; rm -f "$log" "$pylog" "$torchlog"' EXIT
# XLA:CPU compiles dominate both pytest and the harness's pjrt-cpu trials (small modules).
# Two settings cut their CPU time with the same verdicts (docs/backends.md): backend
# optimization level 0 (about a third less) and the elemental IR emitters instead of the
# MLIR fusion emitters (about 40% less again). TPU and GPU compiles are not affected: the
# harness sets them in pjrt-cpu's compile options only (GRPO_XLA_CPU_OPT_LEVEL,
# GRPO_XLA_CPU_FUSION_EMITTERS), and pytest runs on the CPU platform alone
# (backends/jax/tests/conftest.py).
export GRPO_XLA_CPU_OPT_LEVEL="${GRPO_XLA_CPU_OPT_LEVEL:-0}"
export GRPO_XLA_CPU_FUSION_EMITTERS="${GRPO_XLA_CPU_FUSION_EMITTERS:-0}"
pyflags="--xla_backend_optimization_level=$GRPO_XLA_CPU_OPT_LEVEL"
case "$GRPO_XLA_CPU_FUSION_EMITTERS" in
  0) pyflags="$pyflags --xla_cpu_use_fusion_emitters=false" ;;
  1) pyflags="$pyflags --xla_cpu_use_fusion_emitters=true" ;;
esac
# pytest (about 4 min of one core's work with these settings, in two pytest-xdist
# workers) runs while cargo compiles the workspace's tests (about 3.5 min on two cores):
# the three share both cores, and pytest's workers fill the gaps of cargo's serial steps
# (links). Its output is shown when both are done.
echo "== pytest backends/jax (2 workers, in the background) and cargo test --no-run" >&2
XLA_FLAGS="${XLA_FLAGS:-} $pyflags" \
  .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 backends/jax/tests >"$pylog" 2>&1 &
pypid=$!
cargo test --workspace --release --no-run 2>&1 | tee -a "$log"
took "cargo build of the tests, with pytest running"
wait "$pypid"
py=$?
pypid=""
echo "== pytest backends/jax" >&2
tee -a "$log" <"$pylog"
took "pytest after the build"
wait "$torchpid"
torchsetup=$?
cat "$torchlog" >&2
rm -f "$torchlog"
[ "$torchsetup" -eq 0 ] || { echo "scripts/setup_torch.sh or scripts/setup_dashboards.sh failed (exit $torchsetup): the torch backend's and the export's tests cannot run" >&2; exit 1; }
took "torch and dashboards environments (downloaded in the background)"
echo "== cargo test" >&2
export GRPO_REQUIRE_BACKENDS="${GRPO_REQUIRE_BACKENDS:-reference,pjrt-cpu,tpu-aot-v6e-2x2}"
cargo test --workspace --release --no-fail-fast "$@" 2>&1 | tee -a "$log"
rs=${PIPESTATUS[0]}
took "cargo test"
# The TPU execution backend is compiled in every build (src/backends/pjrt/tpu.rs), so it
# keeps building without a second `--features tpu` build; configs/tpu.yaml must keep
# loading and listing its pjrt-tpu trials (ignored here: no chips).
echo "== cargo test with configs/tpu.yaml (pjrt-tpu trials; ignored without TPU chips)" >&2
GRPO_CONFIG=configs/tpu.yaml cargo test --release --test conformance -- pjrt-tpu/ 2>&1 | tee -a "$log"
tpu=${PIPESTATUS[0]}
[ "$tpu" -eq 0 ] || rs=$tpu
took "configs/tpu.yaml listing"
# The GPU execution backend likewise (the same execution backend, profile `Gpu`):
# configs/gpu.yaml must load, and without an NVIDIA GPU its pjrt-gpu trials are listed as
# ignored with the reason; a listing with no pjrt-gpu trial at all fails.
echo "== cargo test with configs/gpu.yaml (pjrt-gpu trials; ignored without an NVIDIA GPU)" >&2
gpulog="$(mktemp)"
GRPO_CONFIG=configs/gpu.yaml GRPO_REQUIRE_BACKENDS=reference cargo test --release --test conformance -- pjrt-gpu/ 2>&1 | tee "$gpulog" | tee -a "$log"
gpu=${PIPESTATUS[0]}
if [ "$gpu" -eq 0 ] && ! grep -qE '^test pjrt-gpu/.* \.\.\. (ok|FAILED|ignored)' "$gpulog"; then
  echo "configs/gpu.yaml: no pjrt-gpu trial was listed" >&2
  gpu=1
fi
rm -f "$gpulog"
[ "$gpu" -eq 0 ] || rs=$gpu
took "configs/gpu.yaml listing"
# The torch backend on the ci tier (torch_baseline on cpu, every case it supports and its
# trajectories); the backend is required: a missing .venvs/torch makes its trials errors.
echo "== cargo test with configs/torch.yaml (torch-cpu trials)" >&2
GRPO_CONFIG=configs/torch.yaml GRPO_REQUIRE_BACKENDS=reference,torch-cpu cargo test --release --test conformance -- torch-cpu/ 2>&1 | tee -a "$log"
torch=${PIPESTATUS[0]}
[ "$torch" -eq 0 ] || rs=$torch
took "configs/torch.yaml"
sum() { grep -oE "$1" "$log" | grep -oE '[0-9]+' | awk '{s+=$1} END {print s+0}'; }
passed=$(( $(sum '[0-9]+ passed;') + $(sum '^[0-9]+ passed') + $(sum ' [0-9]+ passed in') ))
failed=$(( $(sum '[0-9]+ failed;') + $(sum '[0-9]+ failed,') ))
ignored=$(sum '[0-9]+ ignored;')
echo
echo "all: $passed passed, $failed failed, $ignored skipped"
# Name every failure last, where a truncated log still shows it (libtest and
# libtest-mimic print `test NAME ... FAILED`; pytest -q prints `FAILED path::name`).
grep -E '^test .* \.\.\. FAILED|^FAILED ' "$log" | sed 's/^/failed: /'
[ "$py" -eq 0 ] && [ "$rs" -eq 0 ]
