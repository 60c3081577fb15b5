# syntax=docker/dockerfile:1
# Three images from one source tree. The operator is the default (last) target:
#
#   docker build --target operator -t ghcr.io/promptcache/promptcache-operator:0.1.0 .
#   docker build --target front    -t ghcr.io/promptcache/promptcache-front:0.1.0 .
#   docker build --target picker   -t ghcr.io/promptcache/promptcache-picker:0.1.0 .
#
# The operator image carries only the operator's dependencies and the `gateway` extra for
# the gateway policy step (no torch). The front image
# adds the `front` extra with the CPU build of torch: the cache front decodes prompt-embeds
# payloads on CPU, next to a vLLM container that owns the GPU.
# Both run as the unprivileged user 65532 and need nothing writable but /tmp.
# `scripts/images` builds both with podman on a machine without a registry (README, Images).
# The picker (picker/: GIE v1.5.0's Endpoint Picker with promptcache's plugins) is one
# static Go binary on a base with no shell and no package manager, as user 65532 too.

ARG PYTHON_IMAGE=python:3.12-slim-bookworm
ARG GO_IMAGE=golang:1.26-bookworm
ARG PICKER_BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot

# ---------------------------------------------------------------------------- operator build
FROM ${PYTHON_IMAGE} AS build-base
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/promptcache
WORKDIR /src

FROM build-base AS build-operator
COPY pyproject.toml README.md ./
COPY operator/ operator/
# The `gateway` extra (grpcio) too: the renderer runs the Endpoint Picker's gateway policy step
# (`promptcache gateway-policy`) from this image.
RUN /opt/promptcache/bin/pip install ".[gateway]"

# ---------------------------------------------------------------------------- runtime base
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --gid 65532 promptcache \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin promptcache
# HOME in the one writable place: pods run with a read-only root filesystem and an
# emptyDir at /tmp, and libraries that cache under ~ must not fail there.
ENV PATH=/opt/promptcache/bin:${PATH} \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Numeric user so Kubernetes can verify runAsNonRoot without reading /etc/passwd.
USER 65532:65532
ENTRYPOINT ["promptcache"]

# ---------------------------------------------------------------------------- front build
# torch goes straight into a layer of the front image's own parent, before any source: a
# source change rebuilds (and a node pulls) only the package's small layer, and the
# gigabytes of torch are written once per build, never copied between stages.
FROM runtime AS runtime-torch
# CPU wheels of torch: the CUDA build would add gigabytes the front never uses.
# (scripts/images passes PyPI's index where this one is unreachable, and says so.)
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
USER 0:0
# A throwaway pip (the base may have none); only /opt/torch stays.
RUN python -m venv /tmp/pip \
 && PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 /tmp/pip/bin/pip install \
        --target /opt/torch --index-url "${TORCH_INDEX_URL}" "torch>=2.4,<3" \
 && rm -rf /tmp/pip
USER 65532:65532

FROM runtime-torch AS build-front
USER 0:0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The venv sees the torch layer through a .pth file, so pip counts torch as installed.
RUN python -m venv /opt/promptcache \
 && echo /opt/torch > "$(/opt/promptcache/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/promptcache-torch.pth"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN /opt/promptcache/bin/pip install ".[front]"

# ---------------------------------------------------------------------------- cache front
FROM runtime-torch AS front
COPY --from=build-front /opt/promptcache /opt/promptcache
LABEL org.opencontainers.image.title="promptcache-front" \
      org.opencontainers.image.description="promptcache cache front (runs beside vLLM in each model-server pod)"
CMD ["front"]

# ---------------------------------------------------------------------------- picker
# Compiled on the build machine's platform for the target's (no emulation): CGO off, so
# the binary is static; the module's go.sum pins every dependency.
FROM --platform=$BUILDPLATFORM ${GO_IMAGE} AS build-picker
ARG TARGETOS
ARG TARGETARCH
# Where `go mod download` fetches from (scripts/images lends this machine's module cache).
ARG GOPROXY=https://proxy.golang.org,direct
WORKDIR /src/picker
COPY picker/go.mod picker/go.sum ./
RUN go mod download
COPY picker/ ./
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -mod=readonly -trimpath -ldflags='-s -w' -o /out/epp .

FROM ${PICKER_BASE_IMAGE} AS picker
COPY --from=build-picker /out/epp /epp
USER 65532:65532
LABEL org.opencontainers.image.title="promptcache-picker" \
      org.opencontainers.image.description="promptcache Endpoint Picker: GIE v1.5.0's picker with promptcache's plugins"
ENTRYPOINT ["/epp"]

# ---------------------------------------------------------------------------- operator
FROM runtime AS operator
COPY --from=build-operator /opt/promptcache /opt/promptcache
LABEL org.opencontainers.image.title="promptcache-operator" \
      org.opencontainers.image.description="promptcache operator (kopf): PromptCacheDeployment to serving stack"
CMD ["run", "--all-namespaces"]
