#!/usr/bin/env bash
# README command 1: set up everything (idempotent), then run the smoke suite on the
# embedded default backends (reference + pjrt-cpu with the XLA CPU plugin).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
exec cargo run --release --quiet -- run --suite smoke "$@"
