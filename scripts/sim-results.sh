#!/usr/bin/env bash
# Regenerates the result tables in docs/simulator.md from real runs, so they cannot drift from the code.
#
#   scripts/sim-results.sh            # run the default scenario and the seed sweeps (release build), rewrite in place
#   scripts/sim-results.sh --check    # exit 1 if docs/simulator.md differs from fresh runs
#
# The default scenario's table sits between <!-- sim-results:begin --> and <!-- sim-results:end -->; the seed
# sweeps of the three goal scenarios (`--seeds 1-24`, about a minute on two cores) between <!-- sim-sweeps:begin -->
# and <!-- sim-sweeps:end -->; the corpus (twelve scenarios, static against Tessera over seeds 1-24, one row each)
# between <!-- sim-corpus:begin --> and <!-- sim-corpus:end -->. TESSERA_BIN may name an already built `tessera` binary; otherwise
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
# The corpus (issue 57): every scenario a change must hold on, static against Tessera over seeds 1-24, one row each:
# the median of the per-seed GPU-hour ratios and the worst seed's, and the attainment against static's.
corpus=(default platform-mix-quiet functions-day ceiling-bursty pinned-half-gpu corpus/a100-40-chat-light
  corpus/h200-70b-chat corpus/l4-small-diurnal corpus/l40s-diurnal-8b corpus/a100-40-onoff corpus/h100-busy
  corpus/h100-long-context)
corpus_dir=$(mktemp -d)
trap 'rm -rf "$corpus_dir"' EXIT
for sc in "${corpus[@]}"; do
  "$TESSERA_BIN" simulate --scenario "scenarios/$sc.yaml" --seeds 1-24 --strategies static,tessera --quiet \
    --out "$corpus_dir/${sc//\//-}" >/dev/null
done
# The chart's default keeps a sleeping pod's whole share; its own row shows what gpuPools.lendSleepers: true adds.
"$TESSERA_BIN" simulate --scenario scenarios/default.yaml --seeds 1-24 --strategies static,tessera --quiet \
  --lend-sleepers --out "$corpus_dir/default+lend" >/dev/null
corpus_table=$(python3 - "$corpus_dir" "${corpus[@]}" default+lend <<'PY'
import json, statistics, sys
out, names = sys.argv[1], sys.argv[2:]
print("| scenario | GPU-hours, static / Tessera (median) | Tessera ÷ static, median of seeds (worst) "
      "| attainment, static / Tessera (median) | Tessera − static, points | Tessera's worst seed | seeds under 99% |")
print("|---|---:|---:|---:|---:|---:|---:|")
for n in names:
    sw = json.load(open(f"{out}/{n.replace('/', '-')}/sweep.json"))
    by = lambda seed, k: next(s for s in seed["strategies"] if s["strategy"] == k)
    ratios = [by(x, "tessera")["gpu_hours"] / by(x, "static")["gpu_hours"] for x in sw["seeds"]]
    att = {k: [by(x, k)["slo_attainment"] for x in sw["seeds"]] for k in ("static", "tessera")}
    gh = {k: statistics.median(by(x, k)["gpu_hours"] for x in sw["seeds"]) for k in ("static", "tessera")}
    med = {k: statistics.median(v) for k, v in att.items()}
    under = sum(a < sw["attainment_goal"] for a in att["tessera"])
    label = f"`{sw['scenario']}`" + (", `--lend-sleepers` (gpuPools.lendSleepers: true)" if n.endswith("+lend") else "")
    print(f"| {label} | {gh['static']:.2f} / {gh['tessera']:.2f} | {statistics.median(ratios):.3f}× "
          f"({max(ratios):.3f}×) | {med['static']*100:.2f}% / {med['tessera']*100:.2f}% "
          f"| {(med['tessera']-med['static'])*100:+.2f} | {min(att['tessera'])*100:.2f}% | {under} of {len(ratios)} |")
PY
)
block=$(printf '%s\n\nLast line of `tessera simulate`:\n\n```\n%s\n```\n' "$(printf '%s\n' "$out" | sed '$d')" "$(printf '%s\n' "$out" | tail -n 1)")
new=$(BLOCK="$block" SWEEPS="$sweeps" CORPUS="$corpus_table" python3 - "$doc" <<'PY'
import os, sys
text = open(sys.argv[1]).read()
for name, env in (("sim-results", "BLOCK"), ("sim-sweeps", "SWEEPS"), ("sim-corpus", "CORPUS")):
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
