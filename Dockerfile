# syntax=docker/dockerfile:1
# Two images from one source tree. The operator is the default (last) target:
#
#   docker build --target operator -t ghcr.io/promptcache/promptcache-operator:0.1.0 .
#   docker build --target front    -t ghcr.io/promptcache/promptcache-front:0.1.0 .
#
# The operator image carries only the operator's dependencies and the `gateway` extra for
# the gateway policy step (no torch). The front image
# adds the `front` extra with the CPU build of torch: the cache front decodes prompt-embeds
# payloads on CPU, next to a vLLM container that owns the GPU.
# Both run as the unprivileged user 65532 and need nothing writable but /tmp.

ARG PYTHON_IMAGE=python:3.12-slim-bookworm

# ---------------------------------------------------------------------------- build stages
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
# (`promptcache session-shim`) from this image.
RUN /opt/promptcache/bin/pip install ".[gateway]"

# torch in a directory of its own, installed before any source is copied: a source change
# rebuilds (and a user pulls) only the small layer of the package, never the torch layer.
FROM build-base AS build-torch
# CPU wheels of torch: the CUDA build would add gigabytes the front never uses.
# (scripts/images passes PyPI's index where this one is unreachable; its README says the cost.)
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN /opt/promptcache/bin/pip install --target /opt/torch --index-url "${TORCH_INDEX_URL}" \
        "torch>=2.4,<3"

FROM build-base AS build-front
COPY --from=build-torch /opt/torch /opt/torch
# The venv sees the torch layer through a .pth file, so pip counts torch as installed.
RUN echo /opt/torch > "$(/opt/promptcache/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/promptcache-torch.pth"
COPY pyproject.toml README.md ./
COPY operator/ operator/
RUN /opt/promptcache/bin/pip install ".[front]"

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

# ---------------------------------------------------------------------------- cache front
FROM runtime AS front
COPY --from=build-torch /opt/torch /opt/torch
COPY --from=build-front /opt/promptcache /opt/promptcache
LABEL org.opencontainers.image.title="promptcache-front" \
      org.opencontainers.image.description="promptcache cache front (runs beside vLLM in each model-server pod)"
CMD ["front"]

# ---------------------------------------------------------------------------- operator
FROM runtime AS operator
COPY --from=build-operator /opt/promptcache /opt/promptcache
LABEL org.opencontainers.image.title="promptcache-operator" \
      org.opencontainers.image.description="promptcache operator (kopf): PromptCacheDeployment to serving stack"
CMD ["run", "--all-namespaces"]
