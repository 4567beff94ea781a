#!/usr/bin/env bash
# Measures the activator's cost on loopback (see docs/performance.md, "Activator overhead"):
#   1. proxy overhead, direct vs through `tessera activator`, side by side in one open-loop run;
#   2. scale from zero: backend ready -> held request's response headers.
# Usage: scripts/bench-activator.sh [--rates 200,1000,2000] [--emulator] [--max-in-flight 4096] [--duration 20s]
#        [--trials 20]
# --emulator puts `tessera vllm-sim` behind both paths instead of the minimal backend; --rates runs one overhead
# measurement per rate, each with the activator's load shedding on (--max-in-flight); --trials 0 skips part 2.
set -euo pipefail
cd "$(dirname "$0")/.."
# Two commands: with `--example`, cargo builds only that example, not the `tessera` binary it runs.
cargo build --release --locked -p tessera --bin tessera
cargo build --release --locked -p tessera-activator --example activator_overhead
echo "machine: $(nproc) cores, $(uname -m), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), rustc $(rustc --version | cut -d' ' -f2)"
exec target/release/examples/activator_overhead run --tessera target/release/tessera "$@"
