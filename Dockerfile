# syntax=docker/dockerfile:1
# The one Tessera image: every role is `tessera <role>` (sidecar, gpu-agent, autoscaler, activator, webhook, ...).
#
#   docker build -t tessera:dev .
#
# Build stage: the toolchain is pinned (RUST_VERSION, the version the project is tested with) and the build is
# --locked to Cargo.lock, so an image is reproducible from a commit. Run stage: distroless "cc" (glibc, libgcc,
# CA certificates; no shell, no package manager) rather than scratch, because the gpu-agent and sidecar dlopen
# NVIDIA's libnvidia-ml.so.1, which the NVIDIA container toolkit mounts into GPU pods and which needs glibc's
# dynamic loader. The binary is stripped; it runs as the distroless "nonroot" user (65532), matching the chart's
# runAsUser.
ARG RUST_VERSION=1.95.0

FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY . .
# ring (TLS) is the only C code; rust:slim carries gcc and libc6-dev for it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p tessera \
      --config 'profile.release.strip="symbols"' --config 'profile.release.debug=false' \
 && install -D -m 0755 target/release/tessera /out/tessera \
 && install -D -m 0755 target/release/tessera-sidecar /out/tessera-sidecar

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/tessera /usr/local/bin/tessera
# The sidecar-only binary the webhook injects beside every replica (it links the sidecar alone: less memory per pod).
COPY --from=build /out/tessera-sidecar /usr/local/bin/tessera-sidecar
# Where the NVIDIA container toolkit puts the driver's user-space libraries (NVML) on Debian-based images.
ENV LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu:/usr/lib/aarch64-linux-gnu:/usr/lib64
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tessera"]
