# The demo image the Helm chart deploys by default: the asgi-admission package with its
# demo extra, serving `asgi-admission demo` on port 8000 as an unprivileged user.
#   docker build -t ghcr.io/asgi-admission/demo:0.1.0 .
# BASE_IMAGE is any Debian-like image with python3 (venv, ensurepip), groupadd and useradd.
# WHEELS, a directory of the build context, installs from those wheels only (no index):
# scripts/image builds with a local Debian base and wheels built on the host, for machines
# whose builds cannot reach a registry (docs/containers.md).
ARG BASE_IMAGE=python:3.12-slim
FROM ${BASE_IMAGE}
ARG WHEELS=""
# A digest of the build context (scripts/image computes it). The install below reads the
# context through a bind mount, which is not part of the layer cache's key: without this
# label ahead of it, a rebuild after a source change would reuse the old installed layer.
ARG SOURCE_DIGEST=""

LABEL org.opencontainers.image.title="asgi-admission-demo" \
      io.asgi-admission.source-digest="${SOURCE_DIGEST}"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/asgi-admission/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# The build context (.dockerignore lets in only pyproject.toml, README.md, CHANGELOG.md,
# middleware/ and build/wheels/) is mounted for the install, not copied into a layer.
RUN --mount=type=bind,target=/src,rw \
    python3 -m venv /opt/asgi-admission \
    && pip install ${WHEELS:+--no-index --find-links "/src/$WHEELS"} "/src[demo]" \
    && groupadd --gid 10001 app \
    && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin app

WORKDIR /
# Numeric, so that the chart's runAsNonRoot can verify it without a passwd lookup.
USER 10001:10001
EXPOSE 8000
# Docker and podman (with --format docker) run it; Kubernetes uses the chart's probes.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"]
ENTRYPOINT ["asgi-admission"]
CMD ["demo", "--host", "0.0.0.0", "--port", "8000"]
