#!/usr/bin/env bash
# A real Kubernetes node on this machine, joined to the control plane of scripts/control-plane.sh, for the
# real-node tier of the tests (tessera/tests/real_node.rs) and by hand:
#
#   scripts/real-node.sh build              build the node's binaries when missing (cold and warm: docs/performance.md)
#   scripts/real-node.sh up DIR REGISTRY    start a control plane in DIR (scripts/control-plane.sh, without kwok),
#                                           then containerd and a kubelet joined to it, pulling from the OCI
#                                           registry at REGISTRY (host:port, plain HTTP: scripts/registry.sh up);
#                                           waits for the node to be Ready; prints DIR=, KUBECONFIG=, SERVER=, NODE=
#   scripts/real-node.sh down DIR           stop every pod, the kubelet, containerd and the control plane; undo the
#                                           host changes below; remove DIR
#
# What is built, from upstream source at pinned versions (wrappers in scripts/control-plane/, go.sum committed):
#   - kubelet, from k8s.io/kubernetes at the control plane's version, through the control plane's own wrapper
#     (scripts/control-plane/kubernetes), so it shares the Go build cache with kube-apiserver;
#   - containerd and its runc shim (github.com/containerd/containerd/v2, wrapper scripts/control-plane/containerd):
#     its CRI plugin has CDI always on in 2.x (Debian's containerd 1.6 has none, and DRA needs it), with Debian's
#     runc (`apt-get install runc`; crun refuses these hosts' hybrid cgroups);
#   - the CNI plugins bridge, host-local and loopback (github.com/containernetworking/plugins, wrapper
#     scripts/control-plane/cni); portmap is not built: no pod here asks for a hostPort, and it needs iptables;
#   - the sandbox ("pause") image: Kubernetes' own build/pause/linux/pause.c from the same k8s.io/kubernetes module,
#     compiled static with the system's cc and packed as an OCI archive, pushed to REGISTRY by `up` (the sandbox
#     image is the only one a kubelet needs that no Tessera chart names; registry.k8s.io is not reachable here).
# Everything goes into ${TESSERA_TOOLS_CACHE:-$HOME/.cache/tessera}/real-node, outside the clone; the Go module and
# build caches are the control plane's (one GOMODCACHE, one GOCACHE). A stamp naming the versions is written only
# after every binary built and ran.
#
# The node, and why each piece is set up so:
#   - one node, `tessera-node`, at 10.88.0.1 on a bridge `tessera0` that `up` creates; pods get 10.88.0.0/24 from
#     host-local and reach each other over the bridge, and the host reaches them by their pod IP;
#   - no kube-proxy and no cluster DNS: the API server listens at the `kubernetes` Service's ClusterIP 10.96.0.1:443
#     (put on the bridge too; scripts/control-plane.sh with TESSERA_CONTROL_PLANE_REAL_NODE=1), which is what every
#     in-cluster client dials, and it calls webhooks at their Service's endpoints; Tessera's roles find each other
#     through EndpointSlices, never through a ClusterIP or a DNS name;
#   - cgroupfs driver on cgroup v1 (kubelet 1.36 still runs there, but only when told: failCgroupV1 defaults to true
#     since 1.35, and the kubelet's config sets it false), pods under
#     /sys/fs/cgroup/*/kubepods;
#   - the kubelet sets the kernel tunables it wants (vm.overcommit_memory, kernel.panic, ...) and the bridge plugin
#     turns IPv4 forwarding on: `up` records the values it found and `down` puts them back, and removes the bridge.
# One real node per machine at a time (the bridge and 10.96.0.1:443 are the host's): `up` refuses while another is
# running (/run/tessera-real-node.owner names its DIR).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/tools-cache.sh
. "$repo/scripts/tools-cache.sh"

# The kubelet's version is the control plane's (scripts/control-plane.sh), read from there so the two never part.
KUBERNETES_VERSION=$(sed -n 's/^KUBERNETES_VERSION=//p' "$repo/scripts/control-plane.sh")
CONTAINERD_VERSION=$(sed -n 's|^require github.com/containerd/containerd/v2 v||p' "$repo/scripts/control-plane/containerd/go.mod")
CNI_PLUGINS_VERSION=$(sed -n 's|^require github.com/containernetworking/plugins v||p' "$repo/scripts/control-plane/cni/go.mod")
PAUSE_TAG=3.10-tessera

tools="${TESSERA_TOOLS_CACHE:-$HOME/.cache/tessera}"
cache="$tools/real-node"
bin="$cache/bin"
gocache="$tools/control-plane/go"
stamp="$bin/.tessera-built-kubelet-$KUBERNETES_VERSION-containerd-$CONTAINERD_VERSION-cni-$CNI_PLUGINS_VERSION-pause-$PAUSE_TAG"
NODE=tessera-node
BRIDGE=tessera0
NODE_IP=10.88.0.1
POD_CIDR=10.88.0.0/24
API_IP=10.96.0.1
OWNER=/run/tessera-real-node.owner
# What the kubelet and the bridge plugin change on the host, put back by `down`.
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys
  kernel.keys.root_maxbytes net.ipv4.ip_forward)

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'real-node: %s\n' "$*" >&2; exit 1; }

gobuild() { # wrapper-dir output package [tags] [ldflags]
  local dir=$1 out=$2 pkg=$3 tags=${4:-} ldflags=${5:-}
  local started=$SECONDS
  log "building $(basename "$out") ($pkg)"
  (cd "$repo/scripts/control-plane/$dir" \
    && GOMODCACHE="$gocache/mod" GOCACHE="$gocache/build" GOFLAGS="-trimpath -mod=readonly" \
       GOTOOLCHAIN=local CGO_ENABLED=0 GOPROXY="${GOPROXY:-https://proxy.golang.org}" \
       nice go build -tags "$tags" -ldflags="-s -w $ldflags" -o "$out.partial" "$pkg") \
    || die "building $(basename "$out") from $pkg failed (the go output above says why)"
  mv "$out.partial" "$out"
  log "built $(basename "$out") in $((SECONDS - started)) s"
}

need_deb() { # command debian-package why
  command -v "$1" >/dev/null && return 0
  local as_root=""
  [ "$(id -u)" -ne 0 ] && as_root="sudo"
  log "installing Debian's $2"
  { $as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq --no-install-recommends "$2"; } \
    || die "could not install Debian's $2 ($3)"
}

build() {
  need_deb runc runc "containerd runs every container through it"
  need_deb skopeo skopeo "the pause image is pushed to the registry with it"
  if [ -f "$stamp" ]; then return 0; fi
  command -v go >/dev/null || die "go is not installed: the node is built from source with the Go toolchain"
  local started=$SECONDS
  mkdir -p "$bin/cni" "$gocache/mod" "$gocache/build"
  rm -f "$bin"/.tessera-built-*
  # The version the kubelet reports in the Node object (kubectl get nodes), as the control plane's binaries do.
  local kv="-X k8s.io/component-base/version.gitVersion=v$KUBERNETES_VERSION"
  kv+=" -X k8s.io/component-base/version.gitMajor=${KUBERNETES_VERSION%%.*}"
  kv+=" -X k8s.io/component-base/version.gitMinor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2)"
  kv+=" -X k8s.io/component-base/version.gitTreeState=clean"
  # A kubelet of another version (the control plane's moved) is rebuilt; containerd and CNI keep theirs when theirs
  # did not move.
  if [ -x "$bin/kubelet" ] && ! "$bin/kubelet" --version 2>/dev/null | grep -qx "Kubernetes v$KUBERNETES_VERSION"; then
    rm -f "$bin/kubelet"
  fi
  [ -x "$bin/kubelet" ] || gobuild kubernetes "$bin/kubelet" k8s.io/kubernetes/cmd/kubelet "" "$kv"
  # containerd's own release tags: no btrfs/devmapper snapshotters (cgo, unused here); the shim without gRPC.
  local cv="-X github.com/containerd/containerd/v2/version.Version=v$CONTAINERD_VERSION"
  [ -x "$bin/containerd" ] || gobuild containerd "$bin/containerd" github.com/containerd/containerd/v2/cmd/containerd \
    "urfave_cli_no_docs no_btrfs no_devmapper" "$cv"
  [ -x "$bin/containerd-shim-runc-v2" ] || gobuild containerd "$bin/containerd-shim-runc-v2" \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 "urfave_cli_no_docs no_grpc" "$cv"
  local p
  for p in main/bridge ipam/host-local main/loopback; do
    [ -x "$bin/cni/$(basename $p)" ] || gobuild cni "$bin/cni/$(basename $p)" "github.com/containernetworking/plugins/plugins/$p"
  done
  build_pause
  "$bin/kubelet" --version >&2 || die "the built kubelet does not run"
  "$bin/containerd" --version >&2 || die "the built containerd does not run"
  "$bin/containerd-shim-runc-v2" -v >&2 || die "the built containerd-shim-runc-v2 does not run"
  "$bin/cni/bridge" </dev/null 2>&1 | grep -q "CNI bridge plugin" || die "the built CNI bridge plugin does not run"
  touch "$stamp"
  log "real node built in $((SECONDS - started)) s; $(du -sh "$bin" | cut -f1) of binaries"
}

# Kubernetes' pause, from the k8s.io/kubernetes module the kubelet is built from, as a one-file OCI image.
build_pause() {
  local src="$gocache/mod/k8s.io/kubernetes@v$KUBERNETES_VERSION/build/pause/linux/pause.c"
  [ -f "$src" ] || die "$src is not in the module cache (the kubelet's build downloads it)"
  command -v cc >/dev/null || die "cc is missing: the pause binary is compiled from Kubernetes' pause.c"
  cc -Os -Wall -Werror -static -DVERSION="v$PAUSE_TAG" -o "$bin/pause" "$src" \
    || die "compiling $src failed (a static build needs libc6-dev)"
  strip "$bin/pause"
  python3 - "$repo/scripts" "$bin/pause" "$bin/pause.oci.tar" "$PAUSE_TAG" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
from oci_image import gz, layer, sha256  # the same reproducible layer writer as Tessera's image
pause, out, tag = sys.argv[2], sys.argv[3], sys.argv[4]
raw = layer({"/pause": (open(pause, "rb").read(), 0o755)}, {}, 0)
blob = gz(raw)
config = json.dumps({"architecture": "amd64", "os": "linux",
                     "config": {"User": "65535:65535", "Entrypoint": ["/pause"]},
                     "rootfs": {"type": "layers", "diff_ids": [sha256(raw)]}}, sort_keys=True).encode()
manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(config), "size": len(config)},
    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha256(blob), "size": len(blob)}]},
    sort_keys=True).encode()
index = json.dumps({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
    "digest": sha256(manifest), "size": len(manifest), "annotations": {"org.opencontainers.image.ref.name": tag}}]}).encode()
files = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index}
for b in (blob, config, manifest):
    files["blobs/sha256/" + sha256(b).split(":", 1)[1]] = b
open(out, "wb").write(layer({k: (v, 0o644) for k, v in files.items()}, {"blobs": 0o755, "blobs/sha256": 0o755}, 0))
PY
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

start() { # dir name binary args...
  local d=$1 name=$2 b=$3; shift 3
  setsid "$b" "$@" >"$d/$name.log" 2>&1 </dev/null &
  echo $! >"$d/$name.pid"
}

fail_up() { # dir name why
  local d=$1 name=$2 why=$3
  echo "---- last lines of $d/node/$name.log ----" >&2
  tail -n 40 "$d/node/$name.log" >&2 || true
  if [ -z "${TESSERA_REAL_NODE_KEEP:-}" ]; then down "$d"; fi
  die "$name: $why (log: $d/node/$name.log)"
}

api() { # dir path
  curl -fsS --cacert "$1/ca.crt" --cert "$1/admin.crt" --key "$1/admin.key" "https://$API_IP:443$2"
}

sign() { # dir name subject san
  local d=$1 name=$2 subj=$3 san=$4 ext
  ext=$(mktemp)
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" >"$ext"
  openssl req -newkey rsa:2048 -nodes -subj "$subj" -keyout "$d/node/$name.key" -out "$d/node/$name.csr" 2>/dev/null
  openssl x509 -req -in "$d/node/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
    -extfile "$ext" -out "$d/node/$name.crt" 2>/dev/null
  rm -f "$ext" "$d/node/$name.csr"
}

network_up() { # dir
  local d=$1 s
  : >"$d/node/sysctls"
  for s in "${SYSCTLS[@]}"; do echo "$s=$(sysctl -n "$s")" >>"$d/node/sysctls"; done
  ip link del "$BRIDGE" 2>/dev/null || true
  ip link add "$BRIDGE" type bridge || die "cannot create the bridge $BRIDGE (ip link add ... type bridge)"
  ip addr add "$NODE_IP/24" dev "$BRIDGE"
  ip addr add "$API_IP/32" dev "$BRIDGE"
  ip link set "$BRIDGE" up
}

up() {
  local d=${1:-} registry=${2:-}
  [ -n "$d" ] && [ -n "$registry" ] || die "usage: $0 up DIR REGISTRY"
  [ "$(id -u)" -eq 0 ] || die "a kubelet and containerd run as root: run as root"
  build
  if [ -f "$OWNER" ]; then
    local other
    other=$(cat "$OWNER")
    if [ -f "$other/node/kubelet.pid" ] && kill -0 "$(cat "$other/node/kubelet.pid")" 2>/dev/null; then
      die "another real node is running on this machine ($other): scripts/real-node.sh down $other"
    fi
  fi
  mkdir -p "$d/node"
  d="$(cd "$d" && pwd)"
  echo "$d" >"$OWNER"
  local started=$SECONDS
  network_up "$d"
  TESSERA_CONTROL_PLANE_REAL_NODE=1 "$repo/scripts/control-plane.sh" up "$d" >"$d/node/control-plane.out" \
    || { cat "$d/node/control-plane.out" >&2; down "$d"; die "the control plane did not start"; }

  local n="$d/node"
  sign "$d" kubelet-client "/O=system:nodes/CN=system:node:$NODE" "DNS:$NODE"
  sign "$d" kubelet-serving "/O=system:nodes/CN=system:node:$NODE" "IP:$NODE_IP,DNS:$NODE"
  cat >"$n/kubelet.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: tessera-test
  cluster: {server: "https://$API_IP:443", certificate-authority: "$d/ca.crt"}
users:
- name: kubelet
  user: {client-certificate: "$n/kubelet-client.crt", client-key: "$n/kubelet-client.key"}
contexts:
- name: tessera-test
  context: {cluster: tessera-test, user: kubelet}
current-context: tessera-test
EOF

  # The sandbox image, from the registry the node pulls everything from.
  skopeo copy --quiet --dest-tls-verify=false "oci-archive:$bin/pause.oci.tar" "docker://$registry/pause:$PAUSE_TAG" \
    || fail_up "$d" containerd "pushing the pause image to $registry failed"
  mkdir -p "$n/certs.d/$registry" "$n/cni/net.d" "$n/cdi"
  cat >"$n/certs.d/$registry/hosts.toml" <<EOF
server = "http://$registry"
[host."http://$registry"]
  capabilities = ["pull", "resolve"]
EOF
  cat >"$n/cni/net.d/10-tessera.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "tessera", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$n/cni/ipam"}}]}
EOF
  # Every path containerd writes is under DIR/node (root, state, the runc root, network namespaces), so `down`
  # finds all of it; NRI is off (its socket would be the host's /var/run/nri).
  cat >"$n/containerd.toml" <<EOF
version = 3
root = "$n/containerd/root"
state = "$n/containerd/state"
[grpc]
  address = "$n/containerd.sock"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$registry/pause:$PAUSE_TAG"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "$n/certs.d"
[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = ["$n/cdi"]
  netns_mounts_under_state_dir = true
  # These machines' root has no CAP_SYS_RESOURCE (not in its bounding set), so runc cannot lower a process's
  # oom_score_adj below containerd's own (the kubelet asks -998 for every sandbox: "nsexec: failed to update
  # /proc/self/oom_score_adj: Permission denied"). Clamped to containerd's own score instead, as rootless runs do.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        Root = "$n/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$bin/cni"]
    conf_dir = "$n/cni/net.d"
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF
  log "containerd $CONTAINERD_VERSION"
  PATH="$bin:$PATH" start "$n" containerd "$bin/containerd" --config "$n/containerd.toml"
  local deadline=$((SECONDS + 60))
  until [ -S "$n/containerd.sock" ] && grep -q "containerd successfully booted" "$n/containerd.log"; do
    kill -0 "$(cat "$n/containerd.pid")" 2>/dev/null || fail_up "$d" containerd "exited during start-up"
    [ $SECONDS -lt $deadline ] || fail_up "$d" containerd "not up within 60 s"
    sleep 0.3
  done

  local kubelet_port healthz_port
  kubelet_port=$(free_port); healthz_port=$(free_port)
  # Eviction thresholds low: the machine's disk and memory are shared, and the test pods are small.
  cat >"$n/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz_port
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$d/ca.crt"}
authorization: {mode: Webhook}
tlsCertFile: "$n/kubelet-serving.crt"
tlsPrivateKeyFile: "$n/kubelet-serving.key"
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: "unix://$n/containerd.sock"
podLogsDir: "$n/pod-logs"
resolvConf: /etc/resolv.conf
serializeImagePulls: false
# Absolute, not percentages: 1% of a 252 GB disk is 2.5 GB, and a cold run on a busy machine dipped under it
# (disk pressure: the replacement pod of story c was never admitted, and image GC removed the test image).
evictionHard: {memory.available: 100Mi, nodefs.available: 512Mi, imagefs.available: 512Mi, nodefs.inodesFree: 1%}
# 100 turns image garbage collection off: this node lives for one test, and its images are what it tests.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
  log "kubelet $KUBERNETES_VERSION as $NODE ($NODE_IP)"
  start "$n" kubelet "$bin/kubelet" --config "$n/kubelet.yaml" --kubeconfig "$n/kubelet.kubeconfig" \
    --root-dir "$n/kubelet" --hostname-override "$NODE" --node-ip "$NODE_IP" --v=2
  deadline=$((SECONDS + 120))
  until api "$d" "/api/v1/nodes/$NODE" 2>/dev/null | python3 -c '
import json, sys
n = json.load(sys.stdin)
sys.exit(0 if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])) else 1)' 2>/dev/null; do
    kill -0 "$(cat "$n/kubelet.pid")" 2>/dev/null || fail_up "$d" kubelet "exited during start-up"
    kill -0 "$(cat "$n/containerd.pid")" 2>/dev/null || fail_up "$d" containerd "exited while the kubelet started"
    [ $SECONDS -lt $deadline ] || fail_up "$d" kubelet "node $NODE not Ready within 120 s"
    sleep 0.5
  done
  log "real node up in $((SECONDS - started)) s (control plane included)"
  grep -E '^(DIR|KUBECONFIG|SERVER)=' "$n/control-plane.out"
  echo "NODE=$NODE"
}

stop_pid() { # pidfile
  [ -f "$1" ] || return 0
  local pid
  pid=$(cat "$1")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$1"
}

down() {
  local d=${1:-}
  [ -n "$d" ] && [ -d "$d" ] || die "usage: $0 down DIR (the DIR= that up printed)"
  d="$(cd "$d" && pwd)"
  local n="$d/node"
  stop_pid "$n/kubelet.pid"
  # Every container, through runc (its root is this node's own), then the shims and containerd.
  local ns id pid
  for ns in "$n"/runc/*/; do
    [ -d "$ns" ] || continue
    for id in $(runc --root "$ns" list -q 2>/dev/null); do runc --root "$ns" delete --force "$id" >/dev/null 2>&1 || true; done
  done
  for pid in $(grep -las -- "$n/containerd.sock" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3); do
    kill -KILL "$pid" 2>/dev/null || true
  done
  stop_pid "$n/containerd.pid"
  # Volumes, overlay roots, shm and network namespaces were mounted under DIR: unmount them, deepest first.
  awk -v d="$d/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  local c
  for c in /sys/fs/cgroup/*/kubepods; do
    [ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  if [ -f "$n/sysctls" ]; then
    while IFS= read -r kv; do sysctl -q -w "$kv" >/dev/null 2>&1 || true; done <"$n/sysctls"
  fi
  if [ -f "$d/kube-apiserver.pid" ]; then "$repo/scripts/control-plane.sh" down "$d" ${2:-}; fi
  [ "${2:-}" = keep-logs ] || rm -rf "$d"
  [ "$(cat "$OWNER" 2>/dev/null)" = "$d" ] && rm -f "$OWNER"
  return 0
}

cmd=${1:-}
shift || true
case "$cmd" in
  build) build ;;
  up) up "$@" ;;
  down) down "$@" ;;
  *) die "usage: scripts/real-node.sh build | up DIR REGISTRY | down DIR" ;;
esac
