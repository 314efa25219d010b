#!/usr/bin/env bash
# Reproduces the request-body memory attack against a weir worker of its
# own and reports the worker's RSS (docs/reliability.md, "Request bodies
# and memory"): weir dev --simulate runs the control plane (embedded
# Postgres, simulator), a separate `weir dataplane` process is the worker
# measured, and bench/bodyflood sends it CONNS bodies of SIZE bytes with
# one key, each with its last byte withheld.
#
#   bash bench/bodyflood.sh                 # 30 × 31 MiB, default bounds
#   CONNS=30 SIZE=32505856 HOLD=10s bash bench/bodyflood.sh
#   WEIR_BIN=/path/to/other/weir bash bench/bodyflood.sh   # measure another build (a reference)
set -euo pipefail
cd "$(dirname "$0")/.."
CONNS=${CONNS:-30}
SIZE=${SIZE:-32505856}
HOLD=${HOLD:-10s}
work=$(mktemp -d)
bin=${WEIR_BIN:-$work/weir}
[ -n "${WEIR_BIN:-}" ] || go build -o "$bin" ./cmd/weir
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
WEIR_DATA_DIR=$work/data "$bin" dev --simulate --listen 127.0.0.1:17480 --controlplane-listen 127.0.0.1:17481 >"$work/dev.log" 2>&1 &
pids+=($!)
for _ in $(seq 600); do [ -s "$work/data/dev.json" ] && grep -q client_key "$work/data/dev.json" && break; sleep 0.2; done
field() { sed -n 's/.*"'"$1"'": *"\([^"]*\)".*/\1/p' "$work/data/dev.json"; }
WEIR_CONTROLPLANE_URL=$(field controlplane_url) WEIR_DATAPLANE_TOKEN=$(field dataplane_token) \
  "$bin" dataplane --listen 127.0.0.1:17482 >"$work/dataplane.log" 2>&1 &
worker=$!
pids+=($worker)
for _ in $(seq 100); do curl -sf http://127.0.0.1:17482/healthz >/dev/null 2>&1 && break; sleep 0.1; done
go run ./bench/bodyflood -url http://127.0.0.1:17482 -key "$(field client_key)" -pid "$worker" -conns "$CONNS" -size "$SIZE" -hold "$HOLD"
