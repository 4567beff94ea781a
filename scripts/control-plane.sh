#!/usr/bin/env bash
# A real Kubernetes control plane on loopback, built from upstream source, for the control-plane tier of the tests
# (tessera/tests/control_plane.rs) and by hand:
#
#   scripts/control-plane.sh build           build the pinned binaries when missing (cold: see docs/performance.md),
#                                            the KEDA operator and its CRDs included
#   scripts/control-plane.sh up [DIR]        start etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
#                                            kwok (fake GPU nodes) in DIR (default: a new temp dir); print DIR=,
#                                            KUBECONFIG=, SERVER= lines. A component that fails to start fails this
#                                            with the tail of its own log.
#   scripts/control-plane.sh down DIR        stop everything `up` started in DIR (pid files) and remove DIR
#   scripts/control-plane.sh kubeconfig DIR  print the admin kubeconfig's path
#
# With TESSERA_CONTROL_PLANE_REAL_NODE=1 (set by scripts/real-node.sh, which joins a real kubelet to it), `up`
# starts no kwok and no fake nodes, and the API server listens where a pod can reach it with no service proxy:
# at the `kubernetes` Service's ClusterIP, 10.96.0.1:443, an address real-node.sh puts on the node's bridge
# (in-cluster clients dial KUBERNETES_SERVICE_HOST:443, and no kube-proxy runs). It also routes webhook calls to
# a Service's endpoints (pod addresses on the bridge) instead of its ClusterIP, and authenticates to kubelets with
# a client certificate (logs, exec).
#
# What is built, and why this way: kube-apiserver, kube-controller-manager and kube-scheduler from the published
# k8s.io/kubernetes module of one release, through the wrapper module in scripts/control-plane/kubernetes (its
# go.mod maps each k8s.io/* staging module to its published version, which is how the tree builds outside its own
# checkout); etcd and kwok from their own modules, each through a wrapper of its own so that no component's
# dependency versions move another's. go.sum of each wrapper is committed: a build is reproducible and verified.
#
# The binaries, the Go module cache and the Go build cache live OUTSIDE the clone, in
# ${TESSERA_TOOLS_CACHE:-$HOME/.cache/tessera}/control-plane, so a fresh clone (CI) reuses them; .tools/control-plane
# links to it. A stamp naming the pinned versions is written only after every binary built and printed its version;
# a failed build fails this script. (The opt-out, TESSERA_SKIP_CONTROL_PLANE=1, is honoured by scripts/test.sh.)
#
# Everything listens on 127.0.0.1 on free ports, with certificates generated per `up` (openssl). kwok plays the
# kubelets of the nodes `up` creates: two GPU nodes (nvidia.com/gpu: 2 each) whose pod CIDRs are in 127.0.0.0/8, so
# a test can run a process at the address the API server reports for a pod, and one CPU node whose pod CIDR is
# 10.77.0.0/24 (never dialled) — the API server refuses loopback addresses in EndpointSlices, so only pods there
# get EndpointSlice entries from the real controller-manager.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/tools-cache.sh
. "$repo/scripts/tools-cache.sh"

# Kubernetes 1.36 for Dynamic Resource Allocation with consumable capacity (issue 56). What 1.36.3's
# pkg/features/kube_features.go and pkg/controlplane/instance.go say, so no --feature-gates and no --runtime-config
# are needed by any component here (nor by real-node.sh's kubelet):
#   - resource.k8s.io/v1 is a stable group served by default (v1beta1 and v1beta2 are off by default);
#     DynamicResourceAllocation is GA and locked on since 1.35;
#   - DRAConsumableCapacity (KEP-5075: allowMultipleAllocations devices, capacity request policies, consumedCapacity
#     and shareID in allocations) is beta and on by default from 1.36; the API server (fields kept), the scheduler
#     (the allocator counts consumed capacity) and the kubelet's DRA manager (shareID) all read that one gate, and
#     the default ("incubating") allocator supports it. It needs only DynamicResourceAllocation;
#   - also on by default in 1.36: DRAPrioritizedList and DRAAdminAccess (GA), DRAPartitionableDevices,
#     DRADeviceTaints, DRADeviceBindingConditions, DRAExtendedResource, DRAResourceClaimDeviceStatus (beta);
#     DRADeviceTaintRules stays off (its API is an off-by-default beta), as do the 1.36 alphas. None of these is
#     needed for allowMultipleAllocations.
KUBERNETES_VERSION=1.36.3
ETCD_VERSION=3.6.16
KWOK_VERSION=0.8.0
# The KEDA operator, for the story where KEDA scales a Deployment from Tessera's external scaler. Built after the
# control plane with a stamp of its own, so adding or moving it never rebuilds Kubernetes.
KEDA_VERSION=2.21.0

cache="${TESSERA_TOOLS_CACHE:-$HOME/.cache/tessera}/control-plane"
bin="$cache/bin"
stamp="$bin/.tessera-built-k8s-$KUBERNETES_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION"
components=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'control-plane: %s\n' "$*" >&2; exit 1; }

# go build of one main package inside one wrapper module; the module and build caches are the cache dir's own.
gobuild() { # wrapper-dir output package [ldflags...]
  local dir=$1 out=$2 pkg=$3; shift 3
  local started=$SECONDS
  log "building $(basename "$out") ($pkg)"
  (cd "$repo/scripts/control-plane/$dir" \
    && GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOFLAGS="-trimpath -mod=readonly" \
       GOTOOLCHAIN=local CGO_ENABLED=0 GOPROXY="${GOPROXY:-https://proxy.golang.org}" \
       go build -ldflags="-s -w $*" -o "$out.partial" "$pkg") \
    || die "building $(basename "$out") from $pkg failed (the go output above says why)"
  mv "$out.partial" "$out"
  log "built $(basename "$out") in $((SECONDS - started)) s"
}

build() {
  build_control_plane
  build_keda
  link_into_clone control-plane "$cache"
}

# keda-operator and keda-adapter (KEDA's metrics API server, through which the HPA KEDA creates reads a trigger's
# metric above one replica) from github.com/kedacore/keda/v2 (wrapper scripts/control-plane/keda), and KEDA's CRDs
# from the same module (the module zip carries config/crd/bases) into bin/keda-crds. Each binary is built only when
# missing, so a cache from before the adapter was added builds the adapter alone.
build_keda() {
  local keda_stamp="$bin/.tessera-built-keda-$KEDA_VERSION-adapter"
  if [ -f "$keda_stamp" ] && [ -x "$bin/keda-operator" ] && [ -x "$bin/keda-adapter" ] && [ -d "$bin/keda-crds" ]; then
    return 0
  fi
  command -v go >/dev/null || die "go is not installed: the KEDA operator is built from source with the Go toolchain"
  local started=$SECONDS
  mkdir -p "$bin" "$cache/go/mod" "$cache/go/build"
  # A binary of another KEDA version is rebuilt; one of this version (its stamp names it) is kept.
  if ! ls "$bin"/.tessera-built-keda-"$KEDA_VERSION"* >/dev/null 2>&1; then rm -f "$bin/keda-operator" "$bin/keda-adapter"; fi
  rm -f "$bin"/.tessera-built-keda-*
  if [ ! -x "$bin/keda-operator" ]; then
    gobuild keda "$bin/keda-operator" github.com/kedacore/keda/v2/cmd/operator
  fi
  "$bin/keda-operator" --help >/dev/null 2>&1 || die "the built keda-operator does not run"
  if [ ! -x "$bin/keda-adapter" ]; then
    gobuild keda "$bin/keda-adapter" github.com/kedacore/keda/v2/cmd/adapter
  fi
  "$bin/keda-adapter" --help >/dev/null 2>&1 || die "the built keda-adapter does not run"
  local src="$cache/go/mod/github.com/kedacore/keda/v2@v$KEDA_VERSION/config/crd/bases"
  [ -d "$src" ] || die "KEDA's CRDs are not in the module cache at $src"
  rm -rf "$bin/keda-crds"
  mkdir -p "$bin/keda-crds"
  cp "$src"/keda.sh_*.yaml "$bin/keda-crds/"
  chmod u+w "$bin/keda-crds"/*.yaml
  touch "$keda_stamp"
  log "KEDA $KEDA_VERSION operator and metrics adapter built in $((SECONDS - started)) s"
}

build_control_plane() {
  if [ -f "$stamp" ]; then
    local c missing=0
    for c in "${components[@]}"; do [ -x "$bin/$c" ] || missing=1; done
    if [ "$missing" = 0 ]; then return 0; fi
  fi
  command -v go >/dev/null || die "go is not installed: the control plane is built from source with the Go toolchain"
  local started=$SECONDS
  log "building the control plane (Kubernetes $KUBERNETES_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION) into $bin"
  mkdir -p "$bin" "$cache/go/mod" "$cache/go/build"
  rm -f "$bin"/.tessera-built-k8s-*  # KEDA's stamp is its own: a Kubernetes move does not rebuild KEDA
  # The version the API server reports: Helm checks a chart's kubeVersion against it, and kubectl prints it.
  local kv="-X k8s.io/component-base/version.gitVersion=v$KUBERNETES_VERSION"
  kv+=" -X k8s.io/component-base/version.gitMajor=${KUBERNETES_VERSION%%.*}"
  kv+=" -X k8s.io/component-base/version.gitMinor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2)"
  kv+=" -X k8s.io/component-base/version.gitTreeState=clean"
  gobuild etcd "$bin/etcd" go.etcd.io/etcd/server/v3
  gobuild kwok "$bin/kwok" sigs.k8s.io/kwok/cmd/kwok

  local c
  for c in kube-apiserver kube-controller-manager kube-scheduler; do
    gobuild kubernetes "$bin/$c" "k8s.io/kubernetes/cmd/$c" "$kv"
  done
  "$bin/etcd" --version >&2 || die "the built etcd does not run"
  "$bin/kwok" --version >&2 || die "the built kwok does not run"
  for c in kube-apiserver kube-controller-manager kube-scheduler; do
    "$bin/$c" --version >&2 || die "the built $c does not run"
  done
  touch "$stamp"
  log "control plane built in $((SECONDS - started)) s; $(du -sh "$bin" | cut -f1) of binaries"
}

free_port() {
  python3 - <<'EOF'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
EOF
}

# openssl: a CA, and certificates it signs. Client certificates carry the identity (CN user, O group).
certs() { # dir
  local d=$1
  (
    cd "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=tessera-test-ca" \
      -keyout ca.key -out ca.crt 2>/dev/null
    sign() { # name subject [san]
      local name=$1 subj=$2 san=${3:-}
      openssl req -newkey rsa:2048 -nodes -subj "$subj" -keyout "$name.key" -out "$name.csr" 2>/dev/null
      local ext
      ext=$(mktemp)
      if [ -n "$san" ]; then
        printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" >"$ext"
      else
        printf 'extendedKeyUsage=clientAuth\n' >"$ext"
      fi
      openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile "$ext" \
        -out "$name.crt" 2>/dev/null
      rm -f "$name.csr" "$ext"
    }
    sign apiserver "/CN=kube-apiserver" \
      "IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    sign admin "/O=system:masters/CN=tessera-test-admin"
    sign controller-manager "/CN=system:kube-controller-manager"
    sign scheduler "/CN=system:kube-scheduler"
    # kwok plays every node's kubelet (status, leases, pod deletion) across nodes, which no one node identity
    # may do under the Node authorizer: it runs as a cluster admin. Tessera's own roles never do.
    sign kwok "/O=system:masters/CN=kwok"
    # The API server's client certificate towards webhooks is unused: webhooks here do not ask for one.
    # Towards aggregated APIs (KEDA's metrics adapter) it is the front proxy: the adapter trusts the identity
    # headers only from this name, signed by the CA named in --requestheader-client-ca-file.
    sign front-proxy-client "/CN=front-proxy-client"
    # The API server towards a real kubelet (logs, exec); the kubelet authorizes it through a SubjectAccessReview.
    if [ "${TESSERA_CONTROL_PLANE_REAL_NODE:-0}" = 1 ]; then
      sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
    fi
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  ) || die "generating certificates with openssl failed"
}

kubeconfig_for() { # dir name server
  local d=$1 name=$2 server=$3
  cat >"$d/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: tessera-test
  cluster:
    server: $server
    certificate-authority: $d/ca.crt
users:
- name: $name
  user:
    client-certificate: $d/$name.crt
    client-key: $d/$name.key
contexts:
- name: tessera-test
  context: {cluster: tessera-test, user: $name}
current-context: tessera-test
EOF
}

start() { # dir name binary args...
  local d=$1 name=$2 b=$3; shift 3
  setsid "$b" "$@" >"$d/$name.log" 2>&1 </dev/null &
  echo $! >"$d/$name.pid"
}

fail_start() { # dir name why
  local d=$1 name=$2 why=$3
  echo "---- last lines of $d/$name.log ----" >&2
  tail -n 30 "$d/$name.log" >&2 || true
  down "$d" keep-logs
  die "$name: $why (log: $d/$name.log)"
}

alive_or_fail() { # dir name
  kill -0 "$(cat "$1/$2.pid")" 2>/dev/null || fail_start "$1" "$2" "exited during start-up"
}

api() { # dir method path [curl args...]
  local d=$1 method=$2 path=$3; shift 3
  curl -fsS --cacert "$d/ca.crt" --cert "$d/admin.crt" --key "$d/admin.key" -X "$method" \
    "$(cat "$d/server")$path" "$@"
}

node_json() { # name podCIDR gpus
  local gpu_cap="" gpu_label=""
  if [ "$3" -gt 0 ]; then
    gpu_cap=", \"nvidia.com/gpu\": \"$3\""
    gpu_label=", \"nvidia.com/gpu.product\": \"NVIDIA-L4\", \"nvidia.com/gpu.present\": \"true\""
  fi
  cat <<EOF
{"apiVersion": "v1", "kind": "Node",
 "metadata": {"name": "$1", "labels": {"kubernetes.io/hostname": "$1", "kubernetes.io/os": "linux",
   "kubernetes.io/arch": "amd64", "type": "kwok"$gpu_label},
   "annotations": {"kwok.x-k8s.io/node": "fake"}},
 "spec": {"podCIDR": "$2", "podCIDRs": ["$2"]},
 "status": {"capacity": {"cpu": "32", "memory": "128Gi", "pods": "110"$gpu_cap},
            "allocatable": {"cpu": "32", "memory": "128Gi", "pods": "110"$gpu_cap}}}
EOF
}

up() {
  # A real node's control plane runs no KEDA (scripts/real-node.sh): it needs the control plane's binaries only.
  if [ "${TESSERA_CONTROL_PLANE_REAL_NODE:-0}" = 1 ]; then
    build_control_plane
    link_into_clone control-plane "$cache"
  else
    build
  fi
  local d=${1:-}
  if [ -z "$d" ]; then d="$(mktemp -d "${TMPDIR:-/tmp}/tessera-control-plane.XXXXXX")"; else mkdir -p "$d"; fi
  d="$(cd "$d" && pwd)"
  local started=$SECONDS
  certs "$d"
  local etcd_port peer_port api_port api_address=127.0.0.1 real_node_flags=()
  etcd_port=$(free_port); peer_port=$(free_port); api_port=$(free_port)
  if [ "${TESSERA_CONTROL_PLANE_REAL_NODE:-0}" = 1 ]; then
    api_address=10.96.0.1 api_port=443
    real_node_flags=(--enable-aggregator-routing=true
      --kubelet-client-certificate "$d/apiserver-kubelet-client.crt" --kubelet-client-key "$d/apiserver-kubelet-client.key")
  fi
  local server="https://$api_address:$api_port"
  echo "$server" >"$d/server"
  for n in admin controller-manager scheduler kwok; do kubeconfig_for "$d" "$n" "$server"; done

  log "etcd on 127.0.0.1:$etcd_port"
  # --unsafe-no-fsync: a throwaway store on a shared disk; durability is not what these tests are about.
  start "$d" etcd "$bin/etcd" --name tessera-test --data-dir "$d/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "tessera-test=http://127.0.0.1:$peer_port" --unsafe-no-fsync --log-level warn
  local deadline=$((SECONDS + 60))
  until curl -fsS "http://127.0.0.1:$etcd_port/health" 2>/dev/null | grep -q '"health":"true"'; do
    alive_or_fail "$d" etcd
    [ $SECONDS -lt $deadline ] || fail_start "$d" etcd "not healthy within 60 s"
    sleep 0.3
  done

  # The audit log: who wrote what, and when (tessera/tests/control_plane.rs reads it to show that a stepped-down
  # leader wrote nothing). Writes only, at Metadata level: the user (with the token's credential id), the verb, the
  # object and the response code.
  cat >"$d/audit-policy.yaml" <<'EOF2'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
EOF2

  log "kube-apiserver on $server"
  # --endpoint-reconciler-type=none: the `kubernetes` Service's endpoint would be 127.0.0.1, which the API
  # server's own validation refuses for Endpoints and EndpointSlices; nothing here reaches the API server
  # through that Service.
  start "$d" kube-apiserver "$bin/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address "$api_address" --secure-port "$api_port" --advertise-address "$api_address" \
    --endpoint-reconciler-type none \
    --tls-cert-file "$d/apiserver.crt" --tls-private-key-file "$d/apiserver.key" \
    --client-ca-file "$d/ca.crt" \
    --requestheader-client-ca-file "$d/ca.crt" --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "$d/front-proxy-client.crt" --proxy-client-key-file "$d/front-proxy-client.key" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$d/sa.pub" --service-account-signing-key-file "$d/sa.key" \
    --service-cluster-ip-range 10.96.0.0/16 \
    --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy \
    --allow-privileged=true \
    --audit-policy-file "$d/audit-policy.yaml" --audit-log-path "$d/audit.log" --audit-log-format json \
    --cert-dir "$d/apiserver-certs" "${real_node_flags[@]}"
  deadline=$((SECONDS + 120))
  until [ "$(api "$d" GET /readyz 2>/dev/null)" = ok ]; do
    alive_or_fail "$d" kube-apiserver
    [ $SECONDS -lt $deadline ] || fail_start "$d" kube-apiserver "not ready within 120 s"
    sleep 0.5
  done

  log "kube-controller-manager and kube-scheduler"
  start "$d" kube-controller-manager "$bin/kube-controller-manager" \
    --kubeconfig "$d/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$d/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$d/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$(free_port)" \
    --use-service-account-credentials=true \
    --service-account-private-key-file "$d/sa.key" --root-ca-file "$d/ca.crt" \
    --cluster-signing-cert-file "$d/ca.crt" --cluster-signing-key-file "$d/ca.key" \
    --leader-elect=false
  start "$d" kube-scheduler "$bin/kube-scheduler" \
    --kubeconfig "$d/scheduler.kubeconfig" \
    --authentication-kubeconfig "$d/scheduler.kubeconfig" \
    --authorization-kubeconfig "$d/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$(free_port)" --leader-elect=false

  if [ "${TESSERA_CONTROL_PLANE_REAL_NODE:-0}" = 1 ]; then
    # The node is scripts/real-node.sh's to join; pods need only the default ServiceAccount from here.
    deadline=$((SECONDS + 60))
    until api "$d" GET /api/v1/namespaces/default/serviceaccounts/default >/dev/null 2>&1; do
      for c in kube-controller-manager kube-scheduler; do alive_or_fail "$d" "$c"; done
      [ $SECONDS -lt $deadline ] || fail_start "$d" kube-controller-manager "the default ServiceAccount did not appear within 60 s"
      sleep 0.5
    done
    log "control plane up in $((SECONDS - started)) s (for a real node: no kwok)"
    echo "DIR=$d"
    echo "KUBECONFIG=$d/admin.kubeconfig"
    echo "SERVER=$server"
    return 0
  fi

  log "kwok and the fake nodes"
  start "$d" kwok "$bin/kwok" --kubeconfig "$d/kwok.kubeconfig" --manage-all-nodes=true \
    --config "$repo/scripts/control-plane/kwok-stages.yaml" \
    --node-ip 127.0.0.1 --node-lease-duration-seconds 40 --cidr 10.77.255.0/24
  node_json gpu-a 127.77.1.0/24 2 | api "$d" POST /api/v1/nodes -H 'Content-Type: application/json' -d @- >/dev/null \
    || die "creating node gpu-a failed"
  node_json gpu-b 127.77.2.0/24 2 | api "$d" POST /api/v1/nodes -H 'Content-Type: application/json' -d @- >/dev/null \
    || die "creating node gpu-b failed"
  node_json cpu-a 10.77.0.0/24 0 | api "$d" POST /api/v1/nodes -H 'Content-Type: application/json' -d @- >/dev/null \
    || die "creating node cpu-a failed"
  deadline=$((SECONDS + 90))
  while :; do
    for c in kube-controller-manager kube-scheduler kwok; do alive_or_fail "$d" "$c"; done
    local ready
    ready=$(api "$d" GET /api/v1/nodes 2>/dev/null | python3 -c '
import json, sys
nodes = json.load(sys.stdin)["items"]
print(sum(1 for n in nodes for c in n.get("status", {}).get("conditions", []) if c["type"] == "Ready" and c["status"] == "True"))' \
      || echo 0)
    # The controller-manager's service-account controller creates `default` in every namespace: a pod cannot be
    # admitted before it, so wait for it too.
    if [ "$ready" = 3 ] && api "$d" GET /api/v1/namespaces/default/serviceaccounts/default >/dev/null 2>&1; then
      break
    fi
    [ $SECONDS -lt $deadline ] || fail_start "$d" kwok "the nodes (ready: $ready of 3) or the default ServiceAccount did not appear within 90 s"
    sleep 0.5
  done
  log "control plane up in $((SECONDS - started)) s"
  echo "DIR=$d"
  echo "KUBECONFIG=$d/admin.kubeconfig"
  echo "SERVER=$server"
}

down() { # dir [keep-logs]
  local d=${1:-}
  [ -n "$d" ] && [ -d "$d" ] || die "usage: $0 down DIR (the DIR= that up printed)"
  local c pid
  # Reverse start order: nothing is left talking to a stopped API server for long.
  for c in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
    [ -f "$d/$c.pid" ] || continue
    pid=$(cat "$d/$c.pid")
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  done
  for c in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
    [ -f "$d/$c.pid" ] || continue
    pid=$(cat "$d/$c.pid")
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$d/$c.pid"
  done
  if [ "${2:-}" != keep-logs ]; then rm -rf "$d"; fi
}

cmd="${1:-}"
shift || true
case "$cmd" in
  build) build ;;
  up) up "$@" ;;
  down) down "$@" ;;
  kubeconfig) [ $# -eq 1 ] || die "usage: $0 kubeconfig DIR"; echo "$1/admin.kubeconfig" ;;
  *) die "unknown command '$cmd' (build | up [DIR] | down DIR | kubeconfig DIR)" ;;
esac
