# Runs N tenants at once; prints each tenant's line and the sum.
run() { # label n secs gib [pct]
  local label=$1 n=$2 secs=$3 gib=$4 pct=${5:-}; local start; start=$(python3 -c 'import time;print(time.time()+12)')
  local pids=() i
  for i in $(seq 1 "$n"); do
    if [ -n "$pct" ]; then CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct python3 scripts/gpu/contend-tenant.py "$start" "$secs" "$gib" "$label-$i" > /tmp/c.$i & else python3 scripts/gpu/contend-tenant.py "$start" "$secs" "$gib" "$label-$i" > /tmp/c.$i & fi
    pids+=($!)
  done
  wait "${pids[@]}"
  for i in $(seq 1 "$n"); do cat /tmp/c.$i; done | tee -a "$OUT/contend.jsonl"
  echo "SUM $label: $(cat $(seq -f /tmp/c.%g 1 "$n") | python3 -c 'import sys,json; print(round(sum(json.loads(l)["weight_gbps"] for l in sys.stdin),1))') GB/s"
}
