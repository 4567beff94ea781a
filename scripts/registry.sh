#!/usr/bin/env bash
# A real OCI registry on loopback, for publishing Tessera's image and chart the way a user pulls them:
#
#   scripts/registry.sh build         build the registry when missing: go-containerregistry's `crane registry serve`
#                                     (an OCI distribution registry, blobs on disk), from its pinned Go module,
#                                     into ${TESSERA_TOOLS_CACHE:-$HOME/.cache/tessera}/registry (outside the clone)
#   scripts/registry.sh up DIR        start it on a free 127.0.0.1 port with its blobs in DIR; prints REGISTRY=host:port
#   scripts/registry.sh down DIR      stop what `up` started in DIR
#   scripts/registry.sh check ARCHIVE publish and pull back, as the test command does: the image archive pushed
#                                     (skopeo) and inspected from the registry (non-root user, same digest); the chart
#                                     packaged and pushed (`helm package`, `helm push`), then `helm show readme` and
#                                     `helm template … --set image.repository=<registry>/tessera` from oci://
#
# A build that fails, or a registry that does not answer within 10 s, fails the command with its log.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=scripts/tools-cache.sh
. "$repo/scripts/tools-cache.sh"

CRANE_VERSION=v0.22.1
cache="${TESSERA_TOOLS_CACHE:-$HOME/.cache/tessera}/registry"
crane="$cache/bin/crane"
stamp="$cache/bin/.tessera-built-crane-$CRANE_VERSION"

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'registry: %s\n' "$*" >&2; exit 1; }

build() {
  if [ -x "$crane" ] && [ -f "$stamp" ]; then
    return 0
  fi
  log "building crane $CRANE_VERSION (go-containerregistry) into $cache/bin"
  local started=$SECONDS
  mkdir -p "$cache/bin"
  GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOFLAGS="-trimpath" GOTOOLCHAIN=local CGO_ENABLED=0 \
    GOBIN="$cache/bin" GOPROXY="${GOPROXY:-https://proxy.golang.org}" \
    go install -ldflags="-s -w" "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION" \
    || die "building crane from github.com/google/go-containerregistry@$CRANE_VERSION failed (the go output above says why)"
  "$crane" version >/dev/null || die "the built crane does not run"
  touch "$stamp"
  link_into_clone registry "$cache"
  log "crane built in $((SECONDS - started)) s"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

up() {
  local dir=${1:-}
  [ -n "$dir" ] || die "up needs a directory"
  build
  mkdir -p "$dir/blobs"
  local port
  port=$(free_port)
  "$crane" registry serve --address "127.0.0.1:$port" --disk "$dir/blobs" >"$dir/registry.log" 2>&1 &
  echo $! >"$dir/registry.pid"
  for _ in $(seq 1 100); do
    if curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null 2>&1; then
      echo "REGISTRY=127.0.0.1:$port"
      return 0
    fi
    sleep 0.1
  done
  tail -n 20 "$dir/registry.log" >&2 || true
  die "the registry did not answer on 127.0.0.1:$port within 10 s"
}

down() {
  local dir=${1:-}
  [ -n "$dir" ] && [ -f "$dir/registry.pid" ] || return 0
  kill "$(cat "$dir/registry.pid")" 2>/dev/null || true
  rm -rf "$dir"
}

check() {
  local archive=${1:-}
  [ -f "$archive" ] || die "check needs an image archive (scripts/image.sh build prints image=PATH)"
  local helm="$repo/.tools/bin/helm"
  [ -x "$helm" ] || die "$helm is missing: scripts/check-chart.sh installs it"
  local dir version
  dir=$(mktemp -d "${TMPDIR:-/tmp}/tessera-registry.XXXXXX")
  trap 'down "$dir"' RETURN
  local line
  line=$(up "$dir")
  local registry=${line#REGISTRY=}
  version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -n 1)

  "$repo/scripts/image.sh" push "$registry" "$archive" >/dev/null
  local pushed_user local_digest remote_digest
  pushed_user=$(skopeo inspect --tls-verify=false --config "docker://$registry/tessera:$version" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["config"]["User"])')
  [ "${pushed_user%%:*}" = 65532 ] || die "the pushed image runs as $pushed_user"
  local_digest=$(skopeo inspect --format '{{.Digest}}' "oci-archive:$archive")
  remote_digest=$(skopeo inspect --tls-verify=false --format '{{.Digest}}' "docker://$registry/tessera:$version")
  [ "$local_digest" = "$remote_digest" ] || die "the registry holds $remote_digest, the archive is $local_digest"
  echo "image: $registry/tessera:$version $remote_digest user $pushed_user"

  "$helm" package "$repo/charts/tessera" -d "$dir" >/dev/null
  "$helm" push "$dir/tessera-$version.tgz" "oci://$registry/charts" --plain-http >/dev/null 2>&1 \
    || "$helm" push "$dir/tessera-$version.tgz" "oci://$registry/charts" --plain-http
  "$helm" show readme "oci://$registry/charts/tessera" --version "$version" --plain-http 2>/dev/null \
    | grep -q '^# Tessera Helm chart' || die "helm show readme printed no chart README"
  "$helm" template tessera "oci://$registry/charts/tessera" --version "$version" --plain-http \
    --set "image.repository=$registry/tessera" 2>/dev/null \
    | grep -q "image: \"\?$registry/tessera:$version" || die "the chart from oci:// does not run $registry/tessera:$version"
  echo "chart: oci://$registry/charts/tessera $version (helm show readme, helm template with the registry's image)"
}

cmd=${1:-}
shift || true
case "$cmd" in
  build) build ;;
  up) up "$@" ;;
  down) down "$@" ;;
  check) build; check "$@" ;;
  *) die "usage: scripts/registry.sh build | up DIR | down DIR | check ARCHIVE" ;;
esac
