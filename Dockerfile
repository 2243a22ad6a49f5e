# ctxfold server image.
#   docker build -t ctxfold .
#   docker run -p 50051:50051 -v ctxfold-data:/var/lib/ctxfold ctxfold
# Settings come from CTXFOLD_* environment variables or flags after the image name
# (`docker run ctxfold --database postgresql://…`); see `ctxfold serve --help`.
# In-flight RPCs get CTXFOLD_GRACE_SECONDS on SIGTERM. The image sets 8 s, inside `docker stop`'s
# default 10 s; for a longer drain raise both (compose.yaml: 30 s and stop_grace_period 40 s).
ARG PYTHON_IMAGE=python:3.11-slim

# --- builder: build the project's wheel and install it with its dependencies into /opt/ctxfold ---
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/ctxfold
COPY pyproject.toml README.md LICENSE VERSION constraints.txt ./
COPY server/ ./server/
# The gateway's gRPC client: the Python SDK, built from the same commit.
COPY clients/python/pyproject.toml clients/python/README.md clients/python/LICENSE ./clients/python/
COPY clients/python/src/ ./clients/python/src/
# constraints.txt pins every runtime dependency (tests/test_packaging.py keeps it in step with
# pyproject.toml), so two builds of one commit install the same versions.
RUN python -m pip wheel --no-deps --wheel-dir /tmp/wheels . ./clients/python \
    && /opt/ctxfold/bin/pip install --constraint constraints.txt /tmp/wheels/ctxfold-*.whl \
       /tmp/wheels/ctxfold_client-*.whl \
    && /opt/ctxfold/bin/ctxfold --version

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
    CTXFOLD_DATA_DIR=/var/lib/ctxfold \
    CTXFOLD_GRACE_SECONDS=8
# Declared after the directory is created and chowned, so a new volume starts owned by ctxfold.
VOLUME ["/var/lib/ctxfold"]
WORKDIR /var/lib/ctxfold
# Numeric uid:gid so Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
EXPOSE 50051
# The gateway, when CTXFOLD_GATEWAY_LISTEN (or --gateway-listen) is set, e.g. 0.0.0.0:8080.
EXPOSE 8080
# grpc.health.v1 check of the server on the address its own flags, CTXFOLD_* variables and
# --config file give it (`ctxfold healthcheck` reads them from PID 1, the server).
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["ctxfold", "healthcheck", "--timeout", "3"]
ENTRYPOINT ["ctxfold", "serve"]
