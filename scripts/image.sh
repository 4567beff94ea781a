#!/usr/bin/env bash
# Tessera's one image, built from this repository with no registry, no base image and no container engine:
#
#   scripts/image.sh build            build the release binary and the image as an OCI archive; the last line is
#                                     image=PATH (target/image/tessera-<version>.oci.tar)
#   scripts/image.sh smoke [PATH]     check an archive as a kubelet would run it: `skopeo inspect` shows the non-root
#                                     user, and `runc` runs its entrypoint with --version on a read-only root as
#                                     uid 65532 with no capabilities; builds it first when PATH is not given
#   scripts/image.sh push HOST[:PORT] [PATH]
#                                     copy the archive to a registry (skopeo; plain HTTP for 127.0.0.1 / localhost)
#                                     as HOST/tessera:<version>
#
# Reproducible: the layer is written by scripts/oci_image.py with sorted entries, fixed owners and modes, and every
# time set to SOURCE_DATE_EPOCH (default: the commit's time), so two builds of one commit give one digest.
# TESSERA_BIN names an already built binary to package instead (the test command packages its debug build: the
# layout, the user and the runtime are what is checked, not the optimiser). Debian's skopeo and runc are installed
# when missing (with sudo unless root); a failed install fails the command.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

die() { printf 'image: %s\n' "$*" >&2; exit 1; }
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
[ -n "$version" ] || die "no version in Cargo.toml's [workspace.package]"
out_dir=${CARGO_TARGET_DIR:-target}/image
archive="$out_dir/tessera-$version.oci.tar"

need() { # command debian-package
  command -v "$1" >/dev/null && return 0
  local as_root=""
  [ "$(id -u)" -ne 0 ] && as_root="sudo"
  echo "==> installing Debian's $2 (for $1)" >&2
  { $as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -qq --no-install-recommends "$2"; } \
    || die "could not install Debian's $2; scripts/image.sh $cmd needs $1"
}

build() {
  local bin=${TESSERA_BIN:-}
  if [ -z "$bin" ]; then
    cargo build --release --locked -p tessera >&2
    bin=${CARGO_TARGET_DIR:-target}/release/tessera
  fi
  [ -x "$bin" ] || die "$bin is not an executable (set TESSERA_BIN or build first)"
  # The sidecar-only binary cargo builds beside it (the webhook injects /usr/local/bin/tessera-sidecar).
  local sidecar_bin
  sidecar_bin="$(dirname "$bin")/tessera-sidecar"
  [ -x "$sidecar_bin" ] || die "$sidecar_bin is missing: cargo builds it with tessera (cargo build -p tessera)"
  mkdir -p "$out_dir"
  local revision epoch
  revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
  epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
  # The symbols are dropped as the Dockerfile's build does (profile.release.strip); objcopy is deterministic.
  objcopy --strip-all "$bin" "$out_dir/tessera.stripped"
  objcopy --strip-all "$sidecar_bin" "$out_dir/tessera-sidecar.stripped"
  python3 scripts/oci_image.py --binary "$out_dir/tessera.stripped" \
    --sidecar-binary "$out_dir/tessera-sidecar.stripped" --out "$archive" \
    --version "$version" --revision "$revision" --created "$epoch"
  rm -f "$out_dir/tessera.stripped" "$out_dir/tessera-sidecar.stripped"
  echo "image=$archive"
}

# The manifest and config of an archive, and its layer unpacked into DIR/rootfs.
unpack() { # archive dir
  python3 - "$1" "$2" <<'PY'
import json, os, sys, tarfile
archive, dest = sys.argv[1], sys.argv[2]
with tarfile.open(archive) as t:
    read = lambda name: t.extractfile(name).read()
    index = json.loads(read("index.json"))
    blob = lambda d: "blobs/sha256/" + d.split(":", 1)[1]
    manifest = json.loads(read(blob(index["manifests"][0]["digest"])))
    os.makedirs(dest + "/rootfs", exist_ok=True)
    import io
    with tarfile.open(fileobj=io.BytesIO(read(blob(manifest["layers"][0]["digest"])))) as layer:
        layer.extractall(dest + "/rootfs", filter="tar")
    json.dump(json.loads(read(blob(manifest["config"]["digest"]))), open(dest + "/image-config.json", "w"))
PY
}

smoke() {
  local img=${1:-}
  if [ -z "$img" ]; then
    img=$(build | tail -n 1 | sed 's/^image=//')
  fi
  [ -f "$img" ] || die "$img: no such archive (scripts/image.sh build prints its path)"
  need skopeo skopeo
  need runc runc
  local user
  user=$(skopeo inspect --config "oci-archive:$img" | python3 -c 'import json,sys; print(json.load(sys.stdin)["config"]["User"])')
  echo "skopeo inspect: User=$user"
  [ "${user%%:*}" = 65532 ] || die "the image's user is $user, not 65532"
  local bundle
  bundle=$(mktemp -d "${TMPDIR:-/tmp}/tessera-image-smoke.XXXXXX")
  trap 'rm -rf "$bundle"' RETURN
  unpack "$img" "$bundle"
  (cd "$bundle" && runc spec)
  # As a kubelet runs the chart's containers: uid/gid 65532, read-only root, no capabilities, no new privileges.
  python3 - "$bundle" <<'PY'
import json, sys
b = sys.argv[1]
spec = json.load(open(b + "/config.json"))
image = json.load(open(b + "/image-config.json"))["config"]
p = spec["process"]
p["terminal"] = False
uid, gid = (int(x) for x in image["User"].split(":"))
p["user"] = {"uid": uid, "gid": gid}
p["args"] = image["Entrypoint"] + ["--version"]
p["env"] = image["Env"]
p["noNewPrivileges"] = True
p["capabilities"] = {k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")}
spec["root"] = {"path": "rootfs", "readonly": True}
json.dump(spec, open(b + "/config.json", "w"))
PY
  local got
  got=$(runc run --bundle "$bundle" "tessera-smoke-$$" 2>&1) || die "runc could not run the image's entrypoint: $got"
  echo "runc (uid 65532, read-only root, no capabilities): $got"
  case "$got" in
    "tessera $version"*) ;;
    *) die "the entrypoint printed '$got', not 'tessera $version'" ;;
  esac
  # The command the webhook gives the injected sidecar, under the same constraints.
  python3 - "$bundle" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1] + "/config.json"))
spec["process"]["args"] = ["/usr/local/bin/tessera-sidecar", "--version"]
json.dump(spec, open(sys.argv[1] + "/config.json", "w"))
PY
  got=$(runc run --bundle "$bundle" "tessera-smoke-sidecar-$$" 2>&1) || die "runc could not run /usr/local/bin/tessera-sidecar: $got"
  echo "runc (uid 65532, read-only root, no capabilities): $got"
  case "$got" in
    "tessera-sidecar $version"*) ;;
    *) die "/usr/local/bin/tessera-sidecar printed '$got', not 'tessera-sidecar $version'" ;;
  esac
}

push() {
  local registry=${1:-} img=${2:-}
  [ -n "$registry" ] || die "push needs a registry: scripts/image.sh push HOST[:PORT] [ARCHIVE]"
  if [ -z "$img" ]; then
    img=$(build | tail -n 1 | sed 's/^image=//')
  fi
  need skopeo skopeo
  local tls=()
  case "$registry" in 127.*|localhost*) tls=(--dest-tls-verify=false) ;; esac
  skopeo copy "${tls[@]}" "oci-archive:$img" "docker://$registry/tessera:$version" >&2
  echo "pushed=$registry/tessera:$version"
}

cmd=${1:-}
shift || true
case "$cmd" in
  build) build ;;
  smoke) smoke "$@" ;;
  push) push "$@" ;;
  *) die "usage: scripts/image.sh build | smoke [ARCHIVE] | push HOST[:PORT] [ARCHIVE]" ;;
esac
