#!/usr/bin/env bash
# Fleet scale on the real control plane (issue 59): N models, their Deployments and InferenceAutoscalers over
# namespaces, on kwok GPU nodes, decided by the real `tessera autoscaler` (leader-elected, a standby beside it) with
# the real activator; the sidecars are played by one process (tessera/examples/fleet.rs) listening at each pod's
# address, which kwok hands out in 127.0.0.0/8, so the controller reads them exactly as in a cluster.
#
#   scripts/bench-fleet.sh --models N [--namespaces K] [--sync-period 5s] [--duration 120s] [--phase 20s]
#                          [--baseline 20s] [--scale-out 500] [--keep]
#
# Prints one summary line (and writes it with the details to $DIR/bench-fleet.json):
#   models= gpus= controller_rss_mib= controller_cpu_cores= reaction_p50_s= reaction_p99_s=
#   apiserver_requests_per_s= webhook_p99_ms= ... plus wake (from zero), writes, decided and failover keys.
# A benchmark, not a test: scripts/test.sh never runs it (the small fleet check is tessera/tests/fleet.rs).
#
# How each figure is measured:
# - reaction: the fleet process changes a model's document (a burst) and watches the Deployments; the time until
#   the watch shows the count rising (the `/scale` write, seen through a watch on loopback: milliseconds late).
#   wake: from a request sent to the activator for a model at zero to its count leaving zero.
# - controller RSS: /proc/PID/status VmRSS at the end of the steady state (VmHWM too); CPU: utime+stime over the
#   steady state (/proc/PID/stat), divided by its wall time.
# - apiserver_requests_per_s: kube-apiserver's own apiserver_request_total over the steady state, minus its rate
#   over a baseline window before Tessera starts (kwok, the controller-manager, the scheduler and the fleet's
#   watches): what Tessera's roles add. The writes by user come from the audit log (it records writes only).
# - webhook_p99_ms: the real `tessera webhook` admits every pod the fleet creates (the API server calls it over TLS
#   through a MutatingWebhookConfiguration with the chart's rules); at the end a Deployment of --scale-out model
#   pods (labelled tessera.dev/inject=true, a vLLM container asking for a GPU, not injected yet) is created at once,
#   and the p99 is the webhook's own tessera_webhook_admission_duration_seconds over that scale-out (interpolated in
#   its bucket), with the API server's view beside it (apiserver_admission_webhook_admission_duration_seconds:
#   coarse buckets, so the bound of the bucket that holds the 99th percentile).
# - failover: the leader is killed (SIGKILL) at the end; the time until the standby holds the Lease.
#
# Environment: TESSERA_FLEET_CONTROLLER_LOG (the controllers' RUST_LOG, default info; ...,tessera_autoscaler::controller::reconcile=debug
# logs which status fields each write changed), TESSERA_BIN (default target/release/tessera), TESSERA_FLEET_BIN (default
# target/release/examples/fleet; build both with `cargo build --release -p tessera --bin tessera --example fleet`).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"

models="" namespaces=10 sync_period=5s duration=120s phase=20s baseline=20s keep=0 warmup="" scale_out=500
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models=$2; shift 2 ;;
    --namespaces) namespaces=$2; shift 2 ;;
    --sync-period) sync_period=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --phase) phase=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --scale-out) scale_out=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 --models N [--namespaces K] [--sync-period D] [--duration D] [--phase D] [--baseline D] [--warmup D] [--scale-out PODS] [--keep]" >&2; exit 2 ;;
  esac
done
[[ "$models" =~ ^[0-9]+$ ]] && [ "$models" -ge 1 ] || { echo "bench-fleet: --models N (N >= 1) is required" >&2; exit 2; }
[[ "$scale_out" =~ ^[0-9]+$ ]] || { echo "bench-fleet: --scale-out takes a number of pods (0 skips the scale-out)" >&2; exit 2; }

tessera=${TESSERA_BIN:-$repo/target/release/tessera}
fleet=${TESSERA_FLEET_BIN:-$repo/target/release/examples/fleet}
for b in "$tessera" "$fleet"; do
  [ -x "$b" ] || { echo "bench-fleet: $b is missing: cargo build --release -p tessera --bin tessera --example fleet" >&2; exit 1; }
done

log() { printf '==> %s\n' "$*" >&2; }
command -v kubectl >/dev/null || { echo "bench-fleet: kubectl is missing (Debian's kubernetes-client, or the upstream binary on PATH)" >&2; exit 1; }
die() { printf 'bench-fleet: %s\n' "$*" >&2; exit 1; }
secs() { # humantime with one unit (s or m) -> seconds
  case "$1" in *m) echo $((${1%m} * 60)) ;; *s) echo "${1%s}" ;; *) echo "$1" ;; esac
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

up_out=$("$repo/scripts/control-plane.sh" up)
dir=$(sed -n 's/^DIR=//p' <<<"$up_out")
server=$(sed -n 's/^SERVER=//p' <<<"$up_out")
export KUBECONFIG="$dir/admin.kubeconfig"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "$keep" = 1 ]; then log "kept $dir (scripts/control-plane.sh down $dir)"; else "$repo/scripts/control-plane.sh" down "$dir"; fi
}
trap cleanup EXIT

# GPU nodes for two replicas per model (eight GPUs each), pod CIDRs in 127.78.0.0/16 so that the fleet process
# can listen at every pod's address. The control plane's own two GPU nodes keep their pods off (no fleet label).
gpus_per_node=8
nodes=$(( (2 * models + gpus_per_node - 1) / gpus_per_node ))
[ "$nodes" -le 256 ] || die "$models models need $nodes nodes; 127.78.0.0/16 holds 256 /24 pod CIDRs"
gpus=$((nodes * gpus_per_node))
log "$nodes kwok GPU nodes ($gpus GPUs)"
python3 - "$nodes" "$gpus_per_node" >"$dir/fleet-nodes.json" <<'EOF'
import json, sys
n, g = int(sys.argv[1]), sys.argv[2]
items = [{"apiVersion": "v1", "kind": "Node",
          "metadata": {"name": f"fleet-gpu-{k}", "annotations": {"kwok.x-k8s.io/node": "fake"},
                       "labels": {"kubernetes.io/hostname": f"fleet-gpu-{k}", "kubernetes.io/os": "linux",
                                  "type": "kwok", "tessera.dev/fleet": "true", "nvidia.com/gpu.present": "true",
                                  "nvidia.com/gpu.product": "NVIDIA-L4"}},
          "spec": {"podCIDR": f"127.78.{k}.0/24", "podCIDRs": [f"127.78.{k}.0/24"]},
          "status": {"capacity": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": g},
                     "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": g}}}
         for k in range(n)]
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
EOF
kubectl create -f "$dir/fleet-nodes.json" >/dev/null
"$tessera" crdgen | kubectl apply -f - >/dev/null

# One identity per role (client certificates from the control plane's CA), so the audit log tells them apart.
# Cluster admins: RBAC per role is story e of tessera/tests/control_plane.rs; this measures load.
for who in tessera-autoscaler tessera-activator tessera-webhook tessera-fleet; do
  (cd "$dir" \
    && openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=$who" -keyout "$who.key" -out "$who.csr" 2>/dev/null \
    && printf 'extendedKeyUsage=clientAuth\n' >"$who.ext" \
    && openssl x509 -req -in "$who.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile "$who.ext" \
         -out "$who.crt" 2>/dev/null) || die "signing a certificate for $who failed"
  cat >"$dir/$who.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "$server", certificate-authority: "$dir/ca.crt"}}]
users: [{name: u, user: {client-certificate: "$dir/$who.crt", client-key: "$dir/$who.key"}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
EOF
done

sidecar_port=$(free_port)
act_port=$(free_port) act_admin=$(free_port) metrics_a=$(free_port) metrics_b=$(free_port)
wh_port=$(free_port) wh_metrics=$(free_port)

# The webhook, before any fleet pod exists, so that it admits every one: a serving certificate for 127.0.0.1 from
# its own CA (the chart generates one the same way), called by the API server through a MutatingWebhookConfiguration
# with the chart's rules, selectors and fail-open policy, at a URL (no Service routes to loopback here).
(cd "$dir" \
  && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=tessera-webhook-ca" -keyout wh-ca.key -out wh-ca.crt 2>/dev/null \
  && openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout wh.key -out wh.csr 2>/dev/null \
  && printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >wh.ext \
  && openssl x509 -req -in wh.csr -CA wh-ca.crt -CAkey wh-ca.key -CAcreateserial -days 2 -extfile wh.ext -out wh.crt 2>/dev/null) \
  || die "signing the webhook's serving certificate failed"
KUBECONFIG="$dir/tessera-webhook.kubeconfig" RUST_LOG=warn "$tessera" webhook --listen "127.0.0.1:$wh_port" \
  --metrics-listen "127.0.0.1:$wh_metrics" --tls-cert "$dir/wh.crt" --tls-key "$dir/wh.key" \
  --sidecar-port "$sidecar_port" >"$dir/webhook.log" 2>&1 &
pids+=("$!")
deadline=$((SECONDS + 60))
until curl -fs "http://127.0.0.1:$wh_metrics/ready" >/dev/null 2>&1; do
  [ $SECONDS -lt $deadline ] || { tail -n 20 "$dir/webhook.log" >&2; die "the webhook was not ready within 60 s"; }
  sleep 0.5
done
python3 - "$wh_port" "$dir/wh-ca.crt" >"$dir/webhook-config.json" <<'PY'
import base64, json, sys
port, ca = sys.argv[1], base64.b64encode(open(sys.argv[2], "rb").read()).decode()
print(json.dumps({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
  "metadata": {"name": "tessera-webhook-bench"},
  "webhooks": [{"name": "inject.tessera.dev", "admissionReviewVersions": ["v1"],
    "clientConfig": {"url": f"https://127.0.0.1:{port}/mutate", "caBundle": ca},
    "failurePolicy": "Ignore", "timeoutSeconds": 10, "sideEffects": "NoneOnDryRun",
    "reinvocationPolicy": "IfNeeded", "matchPolicy": "Equivalent",
    "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
               "scope": "Namespaced"}],
    "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                                "values": ["kube-system", "tessera-system"]}]},
    "objectSelector": {"matchExpressions": [{"key": "tessera.dev/inject", "operator": "In", "values": ["true"]}]}}]}))
PY
kubectl apply -f "$dir/webhook-config.json" >/dev/null
run_s=$(secs "$duration")
phase_s=$(secs "$phase")
sync_s=$(secs "$sync_period")
warmup=${warmup:-$((3 * sync_s + 25))s}
log "the fleet: $models models over $namespaces namespaces"
KUBECONFIG="$dir/tessera-fleet.kubeconfig" RUST_LOG=warn nice "$fleet" --models "$models" --namespaces "$namespaces" \
  --sidecar-port "$sidecar_port" --activator "http://127.0.0.1:$act_port" \
  --go-file "$dir/fleet.go" --ready-file "$dir/fleet.ready" --steady-file "$dir/fleet.steady" \
  --out "$dir/fleet-result.json" --warmup "$warmup" --duration "$duration" --phase "$phase" \
  >"$dir/fleet.log" 2>&1 &
fleet_pid=$!
pids+=("$fleet_pid")

wait_file() { # file within-seconds what
  local deadline=$((SECONDS + $2))
  until [ -f "$1" ]; do
    kill -0 "$fleet_pid" 2>/dev/null || { tail -n 20 "$dir/fleet.log" >&2; die "the fleet process exited before $3"; }
    [ $SECONDS -lt $deadline ] || { tail -n 20 "$dir/fleet.log" >&2; die "$3 did not happen within $2 s"; }
    sleep 1
  done
}
wait_file "$dir/fleet.ready" $((120 + models)) "every pod ran"

requests_total() { kubectl get --raw /metrics | awk '/^apiserver_request_total\{/ {s += $NF} END {printf "%d\n", s}'; }
log "baseline: the API server's request rate without Tessera, over $baseline"
b0=$(requests_total); bt0=$(date +%s.%N)
sleep "$(secs "$baseline")"
b1=$(requests_total); bt1=$(date +%s.%N)

log "the activator and two controllers (sync period $sync_period)"
KUBECONFIG="$dir/tessera-activator.kubeconfig" RUST_LOG=warn "$tessera" activator --listen "127.0.0.1:$act_port" \
  --admin-listen "127.0.0.1:$act_admin" --hold-timeout 10s >"$dir/activator.log" 2>&1 &
pids+=("$!")
controller() { # identity metrics-port
  KUBECONFIG="$dir/tessera-autoscaler.kubeconfig" RUST_LOG=${TESSERA_FLEET_CONTROLLER_LOG:-info} "$tessera" autoscaler --metrics-listen "127.0.0.1:$2" \
    --sync-period "$sync_period" --sidecar-port "$sidecar_port" --activator-url "http://127.0.0.1:$act_admin" \
    --lease-namespace default --identity "$1" >"$dir/$1.log" 2>&1 &
  echo $!
}
leader_pid=$(controller bench-a "$metrics_a")
pids+=("$leader_pid")
deadline=$((SECONDS + 60))
until [ "$(kubectl -n default get lease tessera-autoscaler -o jsonpath='{.spec.holderIdentity}' 2>/dev/null)" = bench-a ]; do
  [ $SECONDS -lt $deadline ] || die "bench-a did not take the Lease within 60 s"
  sleep 0.5
done
standby_pid=$(controller bench-b "$metrics_b")
pids+=("$standby_pid")
touch "$dir/fleet.go"

wait_file "$dir/fleet.steady" $(( $(secs "$warmup") + 60 )) "the steady state"
ticks=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
c0=$(cpu_ticks "$leader_pid"); s0=$(requests_total); st0=$(date +%s.%N)
log "steady state: the schedule runs for $duration"
wait_file "$dir/fleet-result.json" $((run_s + phase_s + 120)) "the schedule's end"
c1=$(cpu_ticks "$leader_pid"); s1=$(requests_total); st1=$(date +%s.%N)
rss_kib=$(awk '/^VmRSS:/ {print $2}' "/proc/$leader_pid/status")
hwm_kib=$(awk '/^VmHWM:/ {print $2}' "/proc/$leader_pid/status")

# The scale-out: --scale-out new model pods at once, each admitted (and injected) by the webhook. Admission is at
# creation, so pods the fleet's GPUs cannot hold are admitted all the same (and stay Pending until deleted).
scale_out_s=na injected=0
webhook_page() { curl -fs "http://127.0.0.1:$wh_metrics/metrics" >"$dir/webhook-$1.prom"
  kubectl get --raw /metrics | grep '^apiserver_admission_webhook_admission_duration_seconds_bucket' >"$dir/apiserver-webhook-$1.prom" || true; }
webhook_page before
if [ "$scale_out" -gt 0 ]; then
  log "scale-out: $scale_out model pods at once, through the webhook"
  kubectl create namespace fleet-scale-out >/dev/null
  kubectl -n fleet-scale-out apply -f - >/dev/null <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: scale-out}
spec:
  replicas: $scale_out
  selector: {matchLabels: {app: scale-out}}
  template:
    metadata: {labels: {app: scale-out, tessera.dev/inject: "true"}}
    spec:
      nodeSelector: {tessera.dev/fleet: "true"}
      containers:
        - name: vllm
          image: vllm/vllm-openai:fleet
          args: [--model, Qwen/Qwen2.5-7B-Instruct, --max-model-len, "8192"]
          resources: {limits: {nvidia.com/gpu: "1"}}
YAML
  so0=$(date +%s.%N)
  deadline=$((SECONDS + 300))
  until [ "$(kubectl -n fleet-scale-out get pods -l app=scale-out --no-headers 2>/dev/null | wc -l)" -ge "$scale_out" ]; do
    [ $SECONDS -lt $deadline ] || die "the scale-out did not create $scale_out pods within 300 s"
    sleep 1
  done
  scale_out_s=$(python3 -c "import time; print(round(time.time() - $so0, 1))")
  injected=$(kubectl -n fleet-scale-out get pods -l app=scale-out -o json | python3 -c \
    'import json,sys; print(sum(any(c["name"] == "tessera-sidecar" for c in p["spec"].get("initContainers", []) + p["spec"]["containers"]) for p in json.load(sys.stdin)["items"]))')
  log "scale-out: $scale_out pods created in ${scale_out_s}s, $injected of them injected"
  [ "$injected" -eq "$scale_out" ] || log "scale-out: $((scale_out - injected)) pods admitted without the sidecar (see $dir/webhook.log)"
fi
webhook_page after
[ "$scale_out" -eq 0 ] || kubectl delete namespace fleet-scale-out --wait=false >/dev/null

# Failover: the leader dies; how long until the standby holds the Lease.
kill -KILL "$leader_pid"
killed_at=$(date +%s.%N)
deadline=$((SECONDS + 90))
failover=na
while [ $SECONDS -lt $deadline ]; do
  if [ "$(kubectl -n default get lease tessera-autoscaler -o jsonpath='{.spec.holderIdentity}' 2>/dev/null)" = bench-b ]; then
    failover=$(python3 -c "import time; print(round(time.time() - $killed_at, 1))"); break
  fi
  sleep 0.25
done

python3 - "$dir" "$models" "$gpus" "$rss_kib" "$hwm_kib" "$c0" "$c1" "$ticks" "$st0" "$st1" "$s0" "$s1" \
  "$bt0" "$bt1" "$b0" "$b1" "$failover" "$sync_period" "$namespaces" "$scale_out" "$scale_out_s" "$injected" <<'EOF'
import json, re, sys
(d, models, gpus, rss, hwm, c0, c1, ticks, st0, st1, s0, s1, bt0, bt1, b0, b1, failover, sync, nss,
 scale_out, scale_out_s, injected) = sys.argv[1:]

def buckets(path, metric, name=None):
    """Cumulative bucket counts by upper bound from a Prometheus text page; `name` picks one webhook's series
    among the API server's (summed over its other labels)."""
    out = {}
    for line in open(path):
        if not line.startswith(metric + "_bucket"):
            continue
        if name is not None and f'name="{name}"' not in line:
            continue
        le = re.search(r'le="([^"]+)"', line).group(1)
        le = float("inf") if le == "+Inf" else float(le)
        out[le] = out.get(le, 0) + float(line.rsplit(" ", 1)[1])
    return out

def p99(before, after, interpolate):
    """The 99th percentile of what was observed between two pages, and how many were."""
    delta = sorted((le, after[le] - before.get(le, 0)) for le in after)
    if not delta or delta[-1][1] <= 0:
        return None, 0
    total = delta[-1][1]
    rank = 0.99 * total
    lo, below = 0.0, 0.0
    for le, count in delta:
        if count >= rank:
            if not interpolate or le == float("inf"):
                return le, int(total)
            return lo + (le - lo) * (rank - below) / max(count - below, 1e-9), int(total)
        lo, below = le, count
    return None, int(total)

WH = "tessera_webhook_admission_duration_seconds"
API = "apiserver_admission_webhook_admission_duration_seconds"
wh_p99, wh_n = p99(buckets(f"{d}/webhook-before.prom", WH), buckets(f"{d}/webhook-after.prom", WH), True)
api_p99, _ = p99(buckets(f"{d}/apiserver-webhook-before.prom", API, "inject.tessera.dev"),
                 buckets(f"{d}/apiserver-webhook-after.prom", API, "inject.tessera.dev"), False)
r = json.load(open(f"{d}/fleet-result.json"))
steady = float(st1) - float(st0)
cpu = (float(c1) - float(c0)) / float(ticks) / steady
base_rate = (float(b1) - float(b0)) / (float(bt1) - float(bt0))
rate = (float(s1) - float(s0)) / steady
writes = {}
for line in open(f"{d}/audit.log"):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    user = e.get("user", {}).get("username", "")
    if not user.startswith("tessera-") or user == "tessera-fleet":
        continue
    ts = e.get("requestReceivedTimestamp", "")
    from datetime import datetime
    t = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    if not (float(st0) <= t <= float(st1)):
        continue
    ref = e.get("objectRef", {})
    key = f'{e["verb"]}:{ref.get("resource", "")}{"/" + ref["subresource"] if ref.get("subresource") else ""}'
    writes[key] = writes.get(key, 0) + 1
def f(x, p=2):
    return "na" if x is None else f"{x:.{p}f}"
m = int(models)
out = {
    "models": m, "gpus": int(gpus), "controller_rss_mib": f(int(rss) / 1024, 1),
    "controller_cpu_cores": f(cpu, 3),
    "reaction_p50_s": f(r["reaction_p50_s"]), "reaction_p99_s": f(r["reaction_p99_s"]),
    "apiserver_requests_per_s": f(rate - base_rate, 1),
    "webhook_p99_ms": f(None if wh_p99 is None else wh_p99 * 1000, 1),
    "controller_hwm_mib": f(int(hwm) / 1024, 1),
    "rss_kib_per_model": f(int(rss) / m, 1), "cpu_millicores_per_model": f(cpu * 1000 / m, 3),
    "requests_per_s_per_model": f((rate - base_rate) / m, 3),
    "apiserver_total_per_s": f(rate, 1), "apiserver_baseline_per_s": f(base_rate, 1),
    "tessera_writes_per_s": f(sum(writes.values()) / steady, 2),
    "reactions": r["reactions"], "reactions_missed": r["reactions_missed"],
    "wake_p50_s": f(r["wake_p50_s"]), "wake_p99_s": f(r["wake_p99_s"]),
    "wakes": r["wakes_seen"], "wakes_missed": r["wakes_missed"],
    "decided": r["decided"], "failover_s": failover, "sync_period": sync, "namespaces": int(nss),
    "steady_s": f(steady, 0), "setup_s": f(r["setup_s"], 0),
    "scale_out_pods": int(scale_out), "scale_out_s": scale_out_s, "scale_out_injected": int(injected),
    "webhook_admissions": wh_n,
    "webhook_apiserver_p99_le_ms": "na" if api_p99 is None else ("inf" if api_p99 == float("inf") else f(api_p99 * 1000, 0)),
}
json.dump({"summary": out, "writes": writes, "fleet": r}, open(f"{d}/bench-fleet.json", "w"), indent=2)
print(" ".join(f"{k}={v}" for k, v in out.items()))
print("writes by Tessera over the steady state: " + ", ".join(f"{k}={v}" for k, v in sorted(writes.items())), file=sys.stderr)
EOF
