#!/usr/bin/env bash
# Regenerates the result tables in docs/simulator.md from real runs, so they cannot drift from the code.
#
#   scripts/sim-results.sh            # run the default scenario and the seed sweeps (release build), rewrite in place
#   scripts/sim-results.sh --check    # exit 1 if docs/simulator.md differs from fresh runs
#
# The default scenario's table sits between <!-- sim-results:begin --> and <!-- sim-results:end -->; the seed
# sweeps of the three goal scenarios (`--seeds 1-24`, about a minute on two cores) between <!-- sim-sweeps:begin -->
# and <!-- sim-sweeps:end -->. TESSERA_BIN may name an already built `tessera` binary; otherwise
# `cargo run --release` builds it.
set -euo pipefail
cd "$(dirname "$0")/.."
doc=docs/simulator.md
mode=${1:-write}
if [[ -z "${TESSERA_BIN:-}" ]]; then
  cargo build --release -q -p tessera
  TESSERA_BIN=${CARGO_TARGET_DIR:-target}/release/tessera
fi
out=$("$TESSERA_BIN" simulate --markdown)
sweeps=""
for sc in default platform-mix-quiet functions-day; do
  table=$("$TESSERA_BIN" simulate --scenario "scenarios/$sc.yaml" --seeds 1-24 --markdown | sed '$d')
  sweeps=$(printf '%s\n\n%s\n' "$sweeps" "$table")
done
block=$(printf '%s\n\nLast line of `tessera simulate`:\n\n```\n%s\n```\n' "$(printf '%s\n' "$out" | sed '$d')" "$(printf '%s\n' "$out" | tail -n 1)")
new=$(BLOCK="$block" SWEEPS="$sweeps" python3 - "$doc" <<'PY'
import os, sys
text = open(sys.argv[1]).read()
for name, env in (("sim-results", "BLOCK"), ("sim-sweeps", "SWEEPS")):
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    i, j = text.index(begin) + len(begin), text.index(end)
    text = text[:i] + "\n" + os.environ[env].strip() + "\n" + text[j:]
sys.stdout.write(text)
PY
)
if [[ "$mode" == "--check" ]]; then
  if [[ "$new" != "$(cat "$doc")" ]]; then
    echo "docs/simulator.md's result tables differ from fresh runs: run scripts/sim-results.sh" >&2
    diff <(printf '%s\n' "$new") "$doc" >&2 || true
    exit 1
  fi
  echo "docs/simulator.md result tables match fresh runs"
else
  printf '%s\n' "$new" > "$doc"
  echo "rewrote the result tables in $doc"
fi
