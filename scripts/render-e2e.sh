#!/usr/bin/env bash
# Regenerates e2e/manifests.yaml from the chart (charts/tessera + e2e/values.yaml); with --stdout, prints it
# instead (scripts/check-chart.sh diffs that against the committed file). Needs .tools/bin/helm, which
# scripts/check-chart.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
helm=${HELM:-.tools/bin/helm}
python=${PYTHON:-python3}
render() {
  "$helm" template tessera charts/tessera --namespace e2e-namespace-placeholder \
    --kube-version "${KUBE_VERSION:-1.35.0}" -f e2e/values.yaml | "$python" scripts/e2e-manifests.py
}
if [ "${1:-}" = --stdout ]; then render; exit; fi
render >e2e/manifests.yaml.new
mv e2e/manifests.yaml.new e2e/manifests.yaml
echo "wrote e2e/manifests.yaml"
