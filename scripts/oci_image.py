#!/usr/bin/env python3
"""Writes Tessera's OCI image as an OCI archive, byte for byte the same for the same inputs (scripts/image.sh).

    oci_image.py --binary PATH [--sidecar-binary PATH] --out FILE --version V --revision R --created EPOCH
                 [--source URL] [--licenses L]

One layer, no base image: the stripped `tessera` binary at /usr/local/bin/tessera (and the sidecar-only
`tessera-sidecar` beside it, which the webhook injects), the glibc pieces they link
(found with ldd, as the distroless "cc" base the Dockerfile uses carries them), CA certificates, /etc/passwd and
/etc/group with the non-root user 65532 ("nonroot", as distroless names it), and an empty /tmp. Reproducible:
entries sorted, every mtime SOURCE_DATE_EPOCH, owners root (files) and modes normalised, gzip without a name or
time, the config's `created` the same epoch; the digest depends only on the files' bytes and those fields.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

NONROOT = 65532


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def linked_libraries(binary: str) -> list[str]:
    """The shared objects `binary` loads, as ldd resolves them (the loader included)."""
    out = subprocess.run(["ldd", binary], check=True, capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts:
            path = parts[parts.index("=>") + 1]
        elif parts and parts[0].startswith("/"):
            path = parts[0]
        else:
            continue  # linux-vdso: the kernel's, not a file
        if path.startswith("/"):
            libs.append(path)
    return libs


def layer(files: dict[str, tuple[bytes, int]], dirs: dict[str, int], epoch: int) -> bytes:
    """A tar of `dirs` (path -> mode) and `files` (path -> (bytes, mode)), sorted, every header fixed."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries = [(d, None, m) for d, m in dirs.items()] + [(p, b, m) for p, (b, m) in files.items()]
        for path, data, mode in sorted(entries, key=lambda e: e[0]):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.mtime = epoch
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mode = mode
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def gz(data: bytes) -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as g:
        g.write(data)
    return out.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", required=True)
    ap.add_argument("--sidecar-binary", help="the tessera-sidecar binary, at /usr/local/bin/tessera-sidecar")
    ap.add_argument("--out", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--revision", required=True)
    ap.add_argument("--created", type=int, required=True, help="SOURCE_DATE_EPOCH")
    ap.add_argument("--source", default="https://github.com/tessera-dev/tessera")
    ap.add_argument("--licenses", default="Apache-2.0")
    ap.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    a = ap.parse_args()

    files: dict[str, tuple[bytes, int]] = {}
    binaries = {"/usr/local/bin/tessera": a.binary}
    if a.sidecar_binary:
        binaries["/usr/local/bin/tessera-sidecar"] = a.sidecar_binary
    libs: set[str] = set()
    for path, binary in binaries.items():
        with open(binary, "rb") as f:
            files[path] = (f.read(), 0o755)
        libs.update(linked_libraries(binary))
    for lib in sorted(libs):
        real = os.path.realpath(lib)
        with open(real, "rb") as f:
            # Under the name the binary asks for (the soname), so no symlink is needed.
            files[lib] = (f.read(), 0o755)
    with open(a.ca_bundle, "rb") as f:
        files["/etc/ssl/certs/ca-certificates.crt"] = (f.read(), 0o644)
    files["/etc/passwd"] = (f"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{NONROOT}:{NONROOT}:nonroot:/home/nonroot:/sbin/nologin\n".encode(), 0o644)
    files["/etc/group"] = (f"root:x:0:\nnonroot:x:{NONROOT}:\n".encode(), 0o644)
    files["/etc/nsswitch.conf"] = (b"passwd: files\ngroup: files\nhosts: files dns\n", 0o644)
    dirs = {}
    for path in files:
        parent = os.path.dirname(path)
        while parent not in ("", "/"):
            dirs[parent] = 0o755
            parent = os.path.dirname(parent)
    dirs["/tmp"] = 0o1777
    dirs["/home/nonroot"] = 0o755

    raw = layer(files, dirs, a.created)
    compressed = gz(raw)
    created = __import__("datetime").datetime.fromtimestamp(a.created, __import__("datetime").timezone.utc)
    created_s = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    labels = {
        "org.opencontainers.image.source": a.source,
        "org.opencontainers.image.version": a.version,
        "org.opencontainers.image.revision": a.revision,
        "org.opencontainers.image.licenses": a.licenses,
        "org.opencontainers.image.title": "tessera",
        "org.opencontainers.image.description": "Tessera: every role (sidecar, gpu-agent, autoscaler, activator, webhook, ...) as `tessera <role>`",
        "org.opencontainers.image.created": created_s,
    }
    config = {
        "created": created_s,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": f"{NONROOT}:{NONROOT}",
            "Entrypoint": ["/usr/local/bin/tessera"],
            "Env": [
                "PATH=/usr/local/bin:/usr/bin:/bin",
                "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
                # Where the NVIDIA container toolkit mounts the driver's libraries (NVML) on Debian-based hosts.
                "LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu:/usr/lib64",
            ],
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [sha256(raw)]},
        "history": [{"created": created_s, "created_by": "scripts/image.sh build (scripts/oci_image.py)"}],
    }
    config_b = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(config_b), "size": len(config_b)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha256(compressed), "size": len(compressed)}],
        "annotations": labels,
    }
    manifest_b = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sha256(manifest_b),
            "size": len(manifest_b),
            "annotations": {"org.opencontainers.image.ref.name": a.version},
        }],
    }
    blobs = {sha256(b): b for b in (compressed, config_b, manifest_b)}
    layout = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True, separators=(",", ":")).encode(),
    }
    for digest, b in blobs.items():
        layout["blobs/sha256/" + digest.split(":", 1)[1]] = b
    archive_dirs = {"blobs": 0o755, "blobs/sha256": 0o755}
    tmp = a.out + ".partial"
    with open(tmp, "wb") as f:
        f.write(layer({k: (v, 0o644) for k, v in layout.items()}, archive_dirs, a.created))
    os.replace(tmp, a.out)
    print(f"digest={sha256(manifest_b)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
