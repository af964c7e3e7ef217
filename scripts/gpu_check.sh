#!/usr/bin/env bash
# The pjrt-gpu checks on a machine with an NVIDIA GPU and no Rust toolchain (docs/gpu.md):
# run here first, in the project root, to build what travels:
#   bash scripts/gpu_check.sh prepare
# then, on the GPU machine, in the project root (with .device/ taken along):
#   OUT=<dir> bash scripts/gpu_check.sh run ["PART ..."]   (parts, in the order given:
#   smoke, bench, ci, seeds, torch; default "smoke bench ci"; "conformance" = "smoke ci")
# An unknown part is refused before any part runs. `run` exits 0 only when every part it
# ran did (a harness, bench or seeds process that failed, or was cut by its time limit,
# makes it exit 1, naming the part on its last line).
# `run` writes under $OUT: versions.txt, bench.log (`grpo-suite bench` at the seeds' shapes),
# cuda-errors.txt (CUDA error lines at exit; empty when teardown is clean) and gpu-check.tgz:
# conformance-{smoke,ci}.{log,jsonl} (the harness over the smoke and ci tiers' pjrt-gpu
# trials with configs/gpu.yaml, each cut at SMOKE_LIMIT_S / CI_LIMIT_S) and bench-*.jsonl.
# GRPO_PYTHON (default: `python3` on PATH) exports; GRPO_PJRT_PLUGIN (default: that Python's
# jax_plugins/xla_cuda13, else xla_cuda12) executes; when neither is found it stays unset
# (said in versions.txt) and the suite's own lookup decides, or the parts fail.
# CONFORMANCE_FILTER (a harness filter, default pjrt-gpu/) narrows smoke and ci;
# BENCH_IMPL (a `--impl` alternation) and BENCH_CASES (space-separated case globs) narrow the
# bench. `seeds` (only when asked) runs the nightly tier's judged fused cases at the seeds'
# shapes and past 2^31 elements on reference and pjrt-gpu (`grpo-suite run`, cut at
# SEEDS_LIMIT_S): seeds.log in $OUT, seeds.jsonl in the archive. `torch` (only when asked)
# runs the ci tier's torch-cuda trials (torch_baseline, configs/gpu.yaml) with that Python's
# own torch (GRPO_TORCH_PYTHON, default GRPO_PYTHON), cut at TORCH_LIMIT_S:
# conformance-torch.{log,jsonl} in the archive.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
case "${1:-}" in
prepare)
  set -e
  cargo build --release --quiet --bin grpo-suite
  target=${CARGO_TARGET_DIR:-target}
  # The harness's path is on cargo's "Executable" line; on a failed build cargo's own
  # output (the compiler's errors) is shown whole.
  if ! built=$(cargo test --release --no-run --test conformance 2>&1); then
    printf '%s\n' "$built" >&2
    echo "gpu_check prepare: \`cargo test --release --no-run --test conformance\` failed (above)" >&2
    exit 1
  fi
  harness=$(printf '%s\n' "$built" | sed -n 's/.*Executable tests\/conformance\.rs (\(.*\))$/\1/p' | head -1)
  if [ -z "$harness" ] || [ ! -f "$harness" ]; then
    printf '%s\n' "$built" >&2
    echo "gpu_check prepare: no harness path in cargo's output (above)" >&2
    exit 1
  fi
  mkdir -p .device
  cp "$target/release/grpo-suite" .device/grpo-suite && strip .device/grpo-suite
  cp "$harness" .device/conformance && strip .device/conformance
  grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >>.git/info/exclude
  echo "ready: .device/ ($(du -sh .device | cut -f1))"
  ;;
run)
  parts=${2:-all}
  case "$parts" in all) parts="smoke bench ci" ;; conformance) parts="smoke ci" ;; esac
  # Every part name is checked before anything runs (a typo must not cost a device lease).
  n_parts=0
  for part in $parts; do
    case "$part" in
    smoke | bench | ci | seeds | torch) n_parts=$((n_parts + 1)) ;;
    *)
      echo "gpu_check: unknown part '$part' in \"$parts\" (parts: smoke, bench, ci, seeds, torch; or all, conformance); nothing was run" >&2
      exit 2
      ;;
    esac
  done
  if [ "$n_parts" = 0 ]; then
    echo "gpu_check: no part to run in \"$parts\" (parts: smoke, bench, ci, seeds)" >&2
    exit 2
  fi
  : "${OUT:?set OUT to the output directory}"
  mkdir -p "$OUT"
  W=$(mktemp -d)
  PY=${GRPO_PYTHON:-$(command -v python3)}
  if [ -z "$PY" ]; then
    echo "gpu_check: no python3 on PATH: set GRPO_PYTHON to the Python with jax" >&2
    exit 2
  fi
  plugin_note=""
  if [ -z "${GRPO_PJRT_PLUGIN:-}" ]; then
    unset GRPO_PJRT_PLUGIN
    found=$("$PY" -c '
import glob, importlib, os, sys
for name in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
    try:
        m = importlib.import_module(name)
    except ImportError:
        continue
    hits = glob.glob(os.path.join(os.path.dirname(m.__file__), "xla_cuda_plugin.so"))
    if hits:
        print(hits[0])
        sys.exit(0)
sys.exit(1)' 2>&1)
    if [ $? = 0 ] && [ -f "$found" ]; then
      export GRPO_PJRT_PLUGIN=$found
    else
      # Never an empty GRPO_PJRT_PLUGIN: unset, the suite looks for its venv's plugin and
      # otherwise says what is missing (the parts then fail).
      why=${found##*$'\n'}
      plugin_note="no CUDA PJRT plugin found through $PY (jax_plugins.xla_cuda13, xla_cuda12)${why:+: $why}; GRPO_PJRT_PLUGIN left unset: set it to the plugin's .so"
      echo "gpu_check: $plugin_note" >&2
    fi
  fi
  export GRPO_PYTHON=$PY GRPO_ROOT=$PWD JAX_PLATFORMS=cpu
  # The torch backend's workers (configs/gpu.yaml's torch section) use the machine's torch.
  export GRPO_TORCH_PYTHON=${GRPO_TORCH_PYTHON:-$PY}
  export PYTHONPATH=$PWD/backends/jax${PYTHONPATH:+:$PYTHONPATH}
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PY" -c 'import jax; print("exporter: jax", jax.__version__)'
    "$GRPO_TORCH_PYTHON" -c 'import torch; print("torch:", torch.__version__, "cuda:", torch.cuda.is_available())'
    echo "plugin: ${GRPO_PJRT_PLUGIN:-unset ($plugin_note)}"
    echo "cores: $(nproc)"
  } >"$OUT/versions.txt" 2>&1
  cat "$OUT/versions.txt"
  : >"$OUT/bench.log"
  failed=()
  # A part's failure: its name and why (an exit status, or its time limit).
  check() { # part status limit_s
    case "$2" in
    0) ;;
    124) failed+=("$1 (cut at its limit of $3 s)") ;;
    *) failed+=("$1 (exit $2)") ;;
    esac
  }
  # The harness over the tier's pjrt-gpu trials (records are written as trials end, so a
  # run cut by its time limit still brings its verdicts).
  conformance() { # tier limit_s [name backend filter]
    local name=${3:-$1}
    GRPO_SUITE=$1 GRPO_CONFIG=configs/gpu.yaml GRPO_REQUIRE_BACKENDS=reference,${4:-pjrt-gpu} \
      GRPO_RECORDS="$W/conformance-$name.jsonl" timeout "$2" .device/conformance "${5:-${CONFORMANCE_FILTER:-pjrt-gpu/}}" \
      >"$W/conformance-$name.log" 2>&1
    local rc=$?
    echo "conformance $name: exit $rc" >>"$W/conformance-$name.log"
    check "$name" "$rc" "$2"
  }
  bench_impl=${BENCH_IMPL:-'xla_chunked@1024x8192|xla_chunked@2048x16384-default|jax_baseline'}
  for part in $parts; do
    case "$part" in
    smoke) conformance smoke "${SMOKE_LIMIT_S:-120}" ;;
    ci) conformance ci "${CI_LIMIT_S:-100}" ;;
    torch) conformance ci "${TORCH_LIMIT_S:-120}" torch torch-cuda torch-cuda/ ;;
    bench)
      # `grpo-suite bench` at the seeds' shapes: one process per case, the lighter
      # implementations first (the allocator's peak counts from the client's start, so a
      # trial's device peak is its own only above every earlier trial's).
      read -ra cases <<<"${BENCH_CASES:-logits/bf16/b1_t4096_v151936/* fused/bf16/b1_t8192_v151936_h4096/* fused/bf16/b1_t8192_v151643_h4096/*}"
      for c in "${cases[@]}"; do
        n=$(echo "$c" | cut -d/ -f1,3 | tr / -)
        timeout "${BENCH_LIMIT_S:-100}" .device/grpo-suite bench --config configs/gpu.yaml --backend pjrt-gpu --case "$c" \
          --impl "$bench_impl" --runs 10 --warmup 2 --json "$W/bench-$n.jsonl" >>"$OUT/bench.log" 2>&1
        rc=$?
        echo "bench $c: exit $rc" >>"$OUT/bench.log"
        check "bench $c" "$rc" "${BENCH_LIMIT_S:-100}"
      done
      ;;
    seeds)
      # SEEDS_FILTER / SEEDS_IMPL (space-separated names) narrow it for a short device lease.
      impls=()
      for i in ${SEEDS_IMPL:-}; do impls+=(--impl "$i"); done
      t0=$(date +%s)
      timeout "${SEEDS_LIMIT_S:-480}" .device/grpo-suite run --suite nightly --config configs/gpu.yaml \
        --backend reference --backend pjrt-gpu --wide --records "$OUT/seeds.jsonl" "${impls[@]}" \
        --filter "${SEEDS_FILTER:-*fused/bf16/b1_t8192_*_h4096/*|*fused/bf16/b2_t8192_v151936_h256/*}" >"$OUT/seeds.log" 2>&1
      rc=$?
      echo "seeds: exit $rc after $(($(date +%s) - t0)) s" >>"$OUT/seeds.log"
      check seeds "$rc" "${SEEDS_LIMIT_S:-480}"
      ;;
    esac
  done
  shopt -s nullglob
  grep -hE 'cuda_executor|CUDA error|leaking' "$OUT"/*.log "$W"/*.log >"$OUT/cuda-errors.txt"
  tar czf "$OUT/gpu-check.tgz" -C "$W" .
  echo "CUDA error lines: $(wc -l <"$OUT/cuda-errors.txt")"
  grep -hE '^bench .*exit|^conformance|^test result|^seeds: exit|passed, .* failed|^error' "$OUT"/*.log "$W"/*.log
  if [ "${#failed[@]}" -gt 0 ]; then
    echo "gpu_check: FAILED: $(printf '%s; ' "${failed[@]}" | sed 's/; $//') (logs in $OUT and gpu-check.tgz)" >&2
    exit 1
  fi
  echo "gpu_check: every part passed ($parts)"
  ;;
*)
  echo "usage: bash scripts/gpu_check.sh prepare | run [\"PART ...\"] (smoke, bench, ci, seeds, torch; docs/gpu.md)" >&2
  exit 2
  ;;
esac
