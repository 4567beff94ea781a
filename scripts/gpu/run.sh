#!/usr/bin/env bash
# The GPU checks of docs/performance.md ("On a GPU"): the gpu-agent's NVML path against a process holding 8 GiB,
# the copy floor of vLLM's sleep mode, and co-tenant memory bandwidth under time slicing and MPS. Run on a
# machine with one NVIDIA GPU, PyTorch and nvidia-ml-py; OUT names a folder for the results.
: "${OUT:?set OUT to a folder for the results}"
set -x; export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/gpu.txt
T=${TESSERA_BIN:-target/release/tessera}
# 1. the gpu-agent's NVML path against a process holding 8 GiB
python3 -c "import torch,time; x=torch.empty(8<<30,dtype=torch.uint8,device='cuda'); time.sleep(25)" & H=$!
sleep 10; "$T" gpu-agent --listen 127.0.0.1:9091 --interval 1s > $OUT/agent.log 2>&1 & A=$!
sleep 5
python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9091/v1/gpus').read().decode()); print(u.urlopen('http://127.0.0.1:9091/metrics').read().decode())" > $OUT/agent.txt 2>&1
nvidia-smi --query-compute-apps=pid,used_memory --format=csv >> $OUT/agent.txt; echo "HOLDER_PID=$H" >> $OUT/agent.txt
kill $A; wait $H
# 2. sleep mode's copy floor
timeout 200 python3 scripts/gpu/sleep-floor.py 2 16 60 | tee $OUT/sleep.jsonl
# 3. co-tenant bandwidth: time slicing, then MPS
. scripts/gpu/contend.sh
run solo 1 6 4; run ts2 2 6 4; run ts3 3 6 4
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog; mkdir -p /tmp/mps /tmp/mpslog
if timeout 20 nvidia-cuda-mps-control -d; then sleep 1; run mps1x100 1 6 4 100; run mps1x50 1 6 4 50; run mps2x50 2 6 4 50; run mps2x100 2 6 4 100; run mps3x33 3 6 4 33; echo quit | nvidia-cuda-mps-control; else echo "NO MPS: $(which nvidia-cuda-mps-control)"; fi
cat /tmp/mpslog/*.log 2>/dev/null | tail -5
