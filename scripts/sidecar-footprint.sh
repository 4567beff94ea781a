#!/usr/bin/env bash
# Measures the release `tessera sidecar`'s resident memory and CPU while it scrapes a local server that serves
# a real vLLM /metrics page (testdata/vllm/v0-metrics-kubeai-llama31-8b-fp8.txt, 16.6 KB), side by side in one run:
#   A: --scrape-interval 1s (the goal: RSS <= 15 MiB, CPU <= 0.5% of one core)
#   B: --scrape-interval 1s with TOKIO_WORKER_THREADS=1 (effect of the multi-thread runtime's worker count)
#   C: --scrape-interval 5s (the default)
#   D: --scrape-interval 100ms --window 1m: 600 snapshots in the window after 60 s, the same count a 1 s
#      interval holds with the default 10m window (which 60 s at 1 s cannot fill); also 10x the scrapes, so its
#      CPU time resolves the per-scrape cost above the 10 ms clock-tick granularity of /proc/<pid>/stat.
# RSS is VmRSS (and the peak VmHWM) from /proc/<pid>/status at the end; CPU is (utime+stime) from
# /proc/<pid>/stat over the measured span, after a warm-up, divided by the span.
#
# Usage: scripts/sidecar-footprint.sh [seconds, default 60]   (builds target/release/tessera if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
bin=target/release/tessera
[ -x "$bin" ] || cargo build --release --locked -p tessera
page=testdata/vllm/v0-metrics-kubeai-llama31-8b-fp8.txt
dir=$(mktemp -d)
cp "$page" "$dir/metrics"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
vport=$(port)
python3 -m http.server "$vport" --bind 127.0.0.1 --directory "$dir" >/dev/null 2>&1 &
pids+=($!)
sleep 1

start() { # name interval extra-env...
  local name=$1 interval=$2; shift 2
  local window=10m
  [ "$name" = D ] && window=1m
  env "$@" RUST_LOG=warn "$bin" sidecar --window "$window" --vllm-url "http://127.0.0.1:$vport" --listen "127.0.0.1:$(port)" \
    --scrape-interval "$interval" --no-nvml --gpu-memory-mib 23034 --bytes-per-kv-token 131072 \
    2>"$dir/$name.log" &
  pids+=($!)
  eval "pid_$name=$!"
}
start A 1s
start B 1s TOKIO_WORKER_THREADS=1
start C 5s
start D 100ms
sleep 5 # warm-up: start-up and the first scrapes are not steady state

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
for n in A B C D; do eval "t0_$n=\$(ticks \$pid_$n)"; done
s0=$(date +%s.%N)
sleep "$secs"
s1=$(date +%s.%N)
span=$(echo "$s1 - $s0" | bc -l)

printf '%-4s %-10s %-22s %10s %10s %10s\n' run interval env VmRSS_MiB VmHWM_MiB cpu_%core
for n in A B C D; do
  eval "pid=\$pid_$n; t0=\$t0_$n"
  t1=$(ticks "$pid")
  rss=$(awk '/^VmRSS/ {printf "%.1f", $2/1024}' "/proc/$pid/status")
  hwm=$(awk '/^VmHWM/ {printf "%.1f", $2/1024}' "/proc/$pid/status")
  cpu=$(echo "($t1 - $t0) / $hz / $span * 100" | bc -l)
  case $n in A) iv=1s; ev=-;; B) iv=1s; ev=TOKIO_WORKER_THREADS=1;; C) iv=5s; ev=-;; D) iv=100ms; ev=window=1m;; esac
  printf '%-4s %-10s %-22s %10s %10s %10.3f\n' "$n" "$iv" "$ev" "$rss" "$hwm" "$cpu"
done
echo "span ${span}s, $(nproc) cores, $(uname -m), page $(wc -c <"$page") bytes"
