#!/usr/bin/env bash
# Regenerates the result table in docs/simulator.md from a real run, so it cannot drift from the code.
#
#   scripts/sim-results.sh            # run the default scenario (release build), rewrite the table in place
#   scripts/sim-results.sh --check    # exit 1 if docs/simulator.md differs from a fresh run
#
# The table sits between the markers <!-- sim-results:begin --> and <!-- sim-results:end -->. TESSERA_BIN may
# name an already built `tessera` binary; otherwise `cargo run --release` builds it.
set -euo pipefail
cd "$(dirname "$0")/.."
doc=docs/simulator.md
mode=${1:-write}
if [[ -n "${TESSERA_BIN:-}" ]]; then
  out=$("$TESSERA_BIN" simulate --markdown)
else
  out=$(cargo run --release -q -p tessera -- simulate --markdown)
fi
block=$(printf '%s\n\nLast line of `tessera simulate`:\n\n```\n%s\n```\n' "$(printf '%s\n' "$out" | sed '$d')" "$(printf '%s\n' "$out" | tail -n 1)")
new=$(BLOCK="$block" python3 - "$doc" <<'PY'
import os, sys
text = open(sys.argv[1]).read()
begin, end = "<!-- sim-results:begin -->", "<!-- sim-results:end -->"
i, j = text.index(begin) + len(begin), text.index(end)
sys.stdout.write(text[:i] + "\n" + os.environ["BLOCK"].strip() + "\n" + text[j:])
PY
)
if [[ "$mode" == "--check" ]]; then
  if [[ "$new" != "$(cat "$doc")" ]]; then
    echo "docs/simulator.md's result table differs from a fresh run: run scripts/sim-results.sh" >&2
    diff <(printf '%s\n' "$new") "$doc" >&2 || true
    exit 1
  fi
  echo "docs/simulator.md result table matches a fresh run"
else
  printf '%s\n' "$new" > "$doc"
  echo "rewrote the result table in $doc"
fi
