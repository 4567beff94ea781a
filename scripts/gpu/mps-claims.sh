#!/usr/bin/env bash
# DRA claims under MPS on a real GPU (issue 56, docs/performance.md "DRA claims under MPS"): an MPS control daemon
# as the node runs it, and processes started with the limits `tessera dra-plugin` writes into each claim's CDI spec,
# alone and side by side: does MPS hold each claim to its memory and compute? OUT names a folder for the results.
: "${OUT:?set OUT to a folder for the results}"
set -x; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,uuid --format=csv | tee "$OUT/gpu.txt"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
timeout 20 nvidia-cuda-mps-control -d || { echo "NO MPS: $(command -v nvidia-cuda-mps-control)"; exit 1; }
sleep 1
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
# claims: label memory_mib compute_milli [label memory_mib compute_milli ...]; probe memory in each
case_() {
  local label=$1; shift; local start; start=$(python3 -c 'import time;print(time.time()+15)'); local pids=() i=0
  while [ $# -gt 0 ]; do
    local mib=$2 milli=$3 pct=$(( ($3 + 9) / 10 ))
    NVIDIA_VISIBLE_DEVICES=$UUID CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=${mib}M" CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct \
      timeout 120 python3 scripts/gpu/mps-claim.py "$label/$1" "$start" 5 1 > "/tmp/claim.$i" 2>&1 &
    pids+=($!); i=$((i + 1)); shift 3
  done
  wait "${pids[@]}"
  cat /tmp/claim.* | tee -a "$OUT/claims.jsonl"; rm -f /tmp/claim.*
}
case_ alone-100  full 40960 1000
case_ alone-50   half 20480 500
case_ alone-25   quarter 10240 250
case_ pair-25-75 small 20480 250 large 61440 750
case_ pair-50-50 a 30720 500 b 30720 500
case_ pair-oversubscribed-100-100 a 30720 1000 b 30720 1000
nvidia-smi | tee "$OUT/smi.txt"
echo quit | nvidia-cuda-mps-control
tail -20 "$CUDA_MPS_LOG_DIRECTORY"/control.log > "$OUT/mps-control.log" 2>/dev/null
