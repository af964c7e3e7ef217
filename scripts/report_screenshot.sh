#!/usr/bin/env bash
# Renders a report written by `grpo-suite report ... --out DIR` in headless Chromium to
# DIR/report.png, to look at it as a person would. Installs Debian's chromium if missing.
#   scripts/report_screenshot.sh DIR [WIDTHxHEIGHT]
set -euo pipefail
dir="${1:?usage: scripts/report_screenshot.sh DIR [WIDTHxHEIGHT]}"
size="${2:-1400x2200}"
[ -f "$dir/report.html" ] || { echo "error: $dir/report.html does not exist (write it with grpo-suite report)" >&2; exit 2; }
if ! command -v chromium >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
    >/dev/null 2> >(grep -v '^debconf: delaying package configuration' >&2)
fi
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --window-size="${size/x/,}" \
  --screenshot="$dir/report.png" "file://$(cd "$dir" && pwd)/report.html" >/dev/null 2>&1
echo "wrote $dir/report.png"
