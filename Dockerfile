# The demo image the Helm chart deploys by default: the asgi-admission package with its
# demo extra, serving `asgi-admission demo` on port 8000 as an unprivileged user.
#   docker build -t ghcr.io/asgi-admission/demo:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md CHANGELOG.md ./
COPY middleware ./middleware
RUN pip install ".[demo]" \
    && groupadd --gid 10001 app \
    && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin app

WORKDIR /
# Numeric, so that the chart's runAsNonRoot can verify it without a passwd lookup.
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["asgi-admission"]
CMD ["demo", "--host", "0.0.0.0", "--port", "8000"]
