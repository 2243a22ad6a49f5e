# ctxfold server image.
#   docker build -t ctxfold .
#   docker run -p 50051:50051 -v ctxfold-data:/var/lib/ctxfold ctxfold
# Settings come from CTXFOLD_* environment variables or flags after the image name
# (`docker run ctxfold --database postgresql://…`); see `ctxfold serve --help`.
# In-flight RPCs get CTXFOLD_GRACE_SECONDS (default 30) on SIGTERM: give `docker stop -t` /
# compose `stop_grace_period` a little more than that.
ARG PYTHON_IMAGE=python:3.11-slim

# --- builder: build the project's wheel and install it with its dependencies into /opt/ctxfold ---
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/ctxfold
# README.md* / LICENSE*: copied when present (the wildcard tolerates their absence).
COPY pyproject.toml README.md* LICENSE* ./
COPY server/ ./server/
RUN python -m pip wheel --no-deps --wheel-dir /tmp/wheels . \
    && /opt/ctxfold/bin/pip install /tmp/wheels/ctxfold-*.whl \
    && /opt/ctxfold/bin/ctxfold serve --help >/dev/null

# --- final: the slim runtime with only the virtual environment ---
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="ctxfold" \
      org.opencontainers.image.description="Context maintenance for long-running LLM agents (gRPC service)" \
      org.opencontainers.image.licenses="MIT"
RUN groupadd --system --gid 10001 ctxfold \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/ctxfold \
       --shell /usr/sbin/nologin ctxfold \
    && mkdir -p /var/lib/ctxfold \
    && chown 10001:10001 /var/lib/ctxfold \
    && chmod 0750 /var/lib/ctxfold
COPY --from=builder /opt/ctxfold /opt/ctxfold
ENV PATH=/opt/ctxfold/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    CTXFOLD_LISTEN=0.0.0.0:50051 \
    CTXFOLD_DATA_DIR=/var/lib/ctxfold
# Declared after the directory is created and chowned, so a new volume starts owned by ctxfold.
VOLUME ["/var/lib/ctxfold"]
WORKDIR /var/lib/ctxfold
# Numeric uid:gid so Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
EXPOSE 50051
# Standard grpc.health.v1 check of the whole server (service ""), on the port CTXFOLD_LISTEN names.
# The check is plaintext: with CTXFOLD_TLS_CERT set, override HEALTHCHECK.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["/opt/ctxfold/bin/python", "-c", "import os, sys, grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; port = os.environ.get('CTXFOLD_LISTEN', ':50051').rsplit(':', 1)[-1]; r = g.HealthStub(grpc.insecure_channel(f'127.0.0.1:{port}')).Check(h.HealthCheckRequest(), timeout=3); sys.exit(r.status != h.HealthCheckResponse.SERVING)"]
ENTRYPOINT ["ctxfold", "serve"]
