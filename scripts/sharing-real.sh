#!/usr/bin/env bash
# Measures two real vLLM replicas sharing one GPU (MPS, and time-slicing where the GPU allows it) at a few batch
# sizes, and prints the model's answer (`tessera sharing`) beside each measurement.
#
#   scripts/sharing-real.sh                  # a model with Qwen2.5-0.5B's shapes and random weights (written
#                                            # here by scripts/real_vllm_model.py, nothing downloaded), batches
#                                            # 1 8 32, both modes
#   MODEL=Qwen/Qwen2.5-0.5B-Instruct PRESET_ARGS="--model-params 4.94e8 --weights-bytes 0.99GB \
#     --kv-bytes-per-token 12288" GPU_ARGS="--gpu h100-80gb" BATCHES="1 8 32" scripts/sharing-real.sh
#
# Needs: an NVIDIA GPU (nvidia-smi, nvidia-cuda-mps-control), `vllm` on PATH, and a built `tessera` (TESSERA_BIN,
# else target/release/tessera). Loopback only. Each configuration decodes BATCH concurrent requests of 512 random
# prompt tokens and 256 output tokens (`vllm bench serve --max-concurrency`), first with one replica alone on the
# GPU, then with two replicas at once (each at 50% of the SMs under MPS).
# Output: one line per (mode, batch) with the measured median TPOT alone and shared and the model's, and the
# ratio of each; the model is within its stated error when the ratios differ by less than 15%. Exits 1 when any
# configuration is outside it (scripts/test.sh runs this where the test machine has an NVIDIA GPU).
#
#   scripts/sharing-real.sh --install        # first install vLLM for CUDA (pinned) into
#                                            # ${TESSERA_TOOLS_CACHE:-$HOME/.cache/tessera}/vllm-gpu-venv when missing
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_GPU_VERSION=0.33.0
if [[ "${1:-}" == --install ]]; then
  venv="${TESSERA_TOOLS_CACHE:-$HOME/.cache/tessera}/vllm-gpu-venv"
  stamp="$venv/.tessera-installed-vllm-$VLLM_GPU_VERSION"
  if [[ ! -f "$stamp" ]]; then
    echo "sharing-real: installing vllm $VLLM_GPU_VERSION (CUDA) into $venv" >&2
    mkdir -p "$(dirname "$venv")"
    [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv" || { echo "sharing-real: python3 -m venv failed" >&2; exit 1; }
    "$venv/bin/python" -m pip install --disable-pip-version-check --quiet "vllm==$VLLM_GPU_VERSION" \
      || { echo "sharing-real: installing vllm $VLLM_GPU_VERSION failed" >&2; exit 1; }
    touch "$stamp"
  fi
  export PATH="$venv/bin:$PATH"
  [[ -x "${TESSERA_BIN:-target/release/tessera}" ]] || cargo build --release --locked -q -p tessera
fi
PRESET_ARGS=${PRESET_ARGS:---model-params 3.61e8 --weights-bytes 0.72GB --kv-bytes-per-token 12288}
GPU_ARGS=${GPU_ARGS:---gpu h100-80gb}
BATCHES=${BATCHES:-1 8 32}
MODES=${MODES:-mps time_slicing}
TESSERA_BIN=${TESSERA_BIN:-target/release/tessera}
OUT=${OUT:-$(mktemp -d)}
for tool in nvidia-smi vllm "$TESSERA_BIN"; do
  command -v "$tool" >/dev/null || { echo "sharing-real: $tool not found (needs a GPU machine with vLLM)" >&2; exit 2; }
done
load_args=()
if [[ -z "${MODEL:-}" ]]; then
  # Random weights in the real shapes: vLLM's python has the tokenizer library the script needs.
  MODEL=$OUT/model
  "$(dirname "$(command -v vllm)")/python" scripts/real_vllm_model.py "$MODEL" --shape half-billion \
    || { echo "sharing-real: writing the model into $MODEL failed" >&2; exit 1; }
  load_args=(--load-format dummy)
fi
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [[ -n "$p" ]] && kill "$p" 2>/dev/null || true; done
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true
}
trap cleanup EXIT

serve() { # port, log, extra env
  local port=$1 log=$2
  env "${@:3}" vllm serve "$MODEL" --host 127.0.0.1 --port "$port" --gpu-memory-utilization 0.4 \
    --max-model-len 2048 "${load_args[@]}" >"$log" 2>&1 &
  pids+=($!)
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0
    sleep 1
  done
  echo "sharing-real: vLLM on port $port did not start; see $log" >&2
  exit 1
}

tpot() { # port, batch, result json → median TPOT ms
  vllm bench serve --backend vllm --host 127.0.0.1 --port "$1" --model "$MODEL" --dataset-name random \
    --random-input-len 512 --random-output-len 256 --ignore-eos --num-prompts $(( $2 * 4 )) \
    --max-concurrency "$2" --save-result --result-filename "$3" >/dev/null
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["median_tpot_ms"])' "$3"
}

stop_all() {
  for p in "${pids[@]:-}"; do [[ -n "$p" ]] && kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
  pids=()
}

outside=0
for mode in $MODES; do
  env_mps=()
  if [[ "$mode" == mps ]]; then
    export CUDA_MPS_PIPE_DIRECTORY=$OUT/mps-pipe CUDA_MPS_LOG_DIRECTORY=$OUT/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d || { echo "sharing-real: cannot start the MPS daemon" >&2; exit 1; }
    env_mps=(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50)
  fi
  for b in $BATCHES; do
    serve 18001 "$OUT/alone.log"
    alone=$(tpot 18001 "$b" "$OUT/alone-$mode-$b.json")
    stop_all
    serve 18001 "$OUT/a.log" "${env_mps[@]}"
    serve 18002 "$OUT/b.log" "${env_mps[@]}"
    tpot 18002 "$b" "$OUT/b-$mode-$b.json" >/dev/null &
    other=$!
    shared=$(tpot 18001 "$b" "$OUT/a-$mode-$b.json")
    wait "$other"
    stop_all
    model=$("$TESSERA_BIN" sharing $GPU_ARGS $PRESET_ARGS --batch "$b" --context 640 --tenants 2 --share 0.5 \
      --mode "$mode" | tail -n 1)
    rc=0
    python3 - "$mode" "$b" "$alone" "$shared" "$model" <<'PY' || rc=$?
import sys
mode, b, alone, shared, model = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
kv = dict(p.split("=") for p in model.split())
m_ratio, r_ratio = float(kv["tpot_ratio"]), shared / alone
ok = abs(m_ratio / r_ratio - 1) < 0.15
print(f"mode={mode} batch={b} measured_tpot_ms={alone:.2f}->{shared:.2f} (x{r_ratio:.3f}) "
      f"model_tpot_ms={float(kv['tpot_alone_ms']):.2f}->{float(kv['tpot_shared_ms']):.2f} (x{m_ratio:.3f}) "
      f"{'within' if ok else 'OUTSIDE'} 15%")
sys.exit(0 if ok else 3)
PY
    [[ $rc -eq 3 ]] && outside=$((outside + 1))
    [[ $rc -eq 0 || $rc -eq 3 ]] || exit "$rc"
  done
  if [[ "$mode" == mps ]]; then echo quit | nvidia-cuda-mps-control; fi
done
if [[ $outside -gt 0 ]]; then
  echo "sharing-real: the sharing model is outside 15% of the measurement in $outside configuration(s) (lines above)" >&2
  exit 1
fi
