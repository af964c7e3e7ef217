#!/usr/bin/env bash
# Nightly regression run (docs/nightly.md). Idempotent set-up, the nightly tier on the
# backends this machine has (pjrt-tpu and tpu-aot on a TPU VM; pjrt-cpu and tpu-aot
# elsewhere), records kept as <results>/<UTC time>-<host>.jsonl, compared with the
# previous run of the same host, and a report written to <results>/<UTC time>-<host>/.
#
#   scripts/nightly.sh                 # the nightly tier (hours on a 2-core CPU machine)
#   scripts/nightly.sh --small         # the smoke suite, same steps (minutes): what CI-like machines run
#   scripts/nightly.sh --results DIR   # where records and reports go (default results/nightly[-small])
#   scripts/nightly.sh --export        # also export the run for dashboards: a W&B offline run
#                                      # (<out>/wandb, `wandb sync` uploads it) and TensorBoard
#                                      # event files (<out>/tensorboard), tagged nightly and host
#   GRPO_NIGHTLY_EXPORT=1 scripts/nightly.sh   # the same, from the environment
#
# Exit status: 0 all trials ok and no regression against the previous run; 1 failing
# trials or a regression; 2 the run or the comparison could not be made.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
small=0
results=""
export_runs="${GRPO_NIGHTLY_EXPORT:-0}"
while [ $# -gt 0 ]; do
  case "$1" in
    --small) small=1 ;;
    --results) shift; results="${1:?--results needs a directory}" ;;
    --export) export_runs=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
say() { printf '[nightly] %s\n' "$*" >&2; }

bash scripts/setup.sh || exit 2
features=()
config=()
if ls /dev/accel* >/dev/null 2>&1 || ls /dev/vfio/[0-9]* >/dev/null 2>&1; then
  say "TPU chips found: building with --features tpu"
  features=(--features tpu)
  [ "$small" -eq 1 ] || config=(--config configs/nightly-tpu.yaml)
fi
cargo build --release --quiet "${features[@]}" || exit 2
bin="$root/target/release/grpo-suite"

if [ "$small" -eq 1 ]; then suite=smoke; else suite=nightly; fi
[ -n "$results" ] || results="$root/results/nightly$([ "$small" -eq 1 ] && echo -small)"
mkdir -p "$results" || exit 2
host="$(hostname 2>/dev/null || echo host)"
stamp="$(date -u +%Y%m%dT%H%M%SZ)"
prev="$(ls -1 "$results"/*-"$host".jsonl 2>/dev/null | sort | tail -n 1)"
rec="$results/$stamp-$host.jsonl"
out="$results/$stamp-$host"

say "suite $suite, records $rec${prev:+, previous $prev}"
"$bin" run --suite "$suite" "${config[@]}" --records "$rec"
run_rc=$?
if [ "$small" -eq 0 ]; then
  # Users' kernels by config alone: tokamax, tunix, Liger-Kernel, Cut Cross-Entropy and TRL from PyPI, each in its
  # own pinned venv (skipped, with the reason, when PyPI or Python 3.12 is missing). Their
  # records are not compared.
  say "examples/tokamax (records $results/$stamp-$host-tokamax.jsonl)"
  examples/tokamax/run.sh --records "$results/$stamp-$host-tokamax.jsonl" || run_rc=1
  say "examples/tunix, ci tier (records $results/$stamp-$host-tunix.jsonl)"
  examples/tunix/run.sh --records "$results/$stamp-$host-tunix.jsonl" || run_rc=1
  say "examples/tunix, the nightly tier's logits cases (records $results/$stamp-$host-tunix-nightly.jsonl)"
  examples/tunix/run.sh --suite nightly --filter logits/ \
    --records "$results/$stamp-$host-tunix-nightly.jsonl" || run_rc=1
  say "examples/liger (records $results/$stamp-$host-liger.jsonl)"
  examples/liger/run.sh --records "$results/$stamp-$host-liger.jsonl" || run_rc=1
  say "examples/cce (records $results/$stamp-$host-cce.jsonl)"
  examples/cce/run.sh --records "$results/$stamp-$host-cce.jsonl" || run_rc=1
  say "examples/trl (records $results/$stamp-$host-trl.jsonl)"
  examples/trl/run.sh --records "$results/$stamp-$host-trl.jsonl" || run_rc=1
fi
if [ ! -s "$rec" ]; then
  say "the run wrote no records (exit $run_rc): nothing to report"
  exit 2
fi
report=("$bin" report "$rec" --out "$out")
[ -n "$prev" ] && report+=(--baseline "$prev")
"${report[@]}" || exit 2
cmp_rc=0
if [ -n "$prev" ]; then
  "$bin" compare "$prev" "$rec" > "$out/compare.md"
  cmp_rc=$?
  say "comparison with the previous run: $out/compare.md (exit $cmp_rc)"
else
  say "no previous run of $host in $results: nothing to compare with yet"
fi
say "report: $out/report.html"
if [ "$export_runs" = 1 ]; then
  # Each night is one W&B run with the same tags, so a dashboard shows the figures over time.
  bash scripts/setup_dashboards.sh || exit 2
  "$bin" export "$rec" --wandb "$out/wandb" --tensorboard "$out/tensorboard" \
    --name "$suite-$stamp-$host" --tags "$suite,$host" || exit 2
fi
[ "$cmp_rc" -eq 2 ] && exit 2
[ "$run_rc" -ne 0 ] || [ "$cmp_rc" -eq 1 ] && exit 1
exit 0
