# syntax=docker/dockerfile:1
# The gateway image: one uvicorn worker per container; scale with replicas (docs/operations.md).
FROM python:3.11-slim AS build
WORKDIR /src
# Every dependency, and the build backend, checked against its sha256 in the lock
# (docs/security.md#verifying-what-you-installed), from wheels only (no sdist built with tools
# fetched unchecked); the backend in a venv of its own, so it stays out of the image.
COPY requirements/runtime.txt requirements/build.txt ./requirements/
RUN python -m venv /venv \
    && python -m venv /build \
    && /venv/bin/pip install --no-cache-dir --require-hashes --only-binary :all: \
        -r requirements/runtime.txt \
    && /build/bin/pip install --no-cache-dir --require-hashes --only-binary :all: \
        -r requirements/build.txt
COPY pyproject.toml README.md ./
COPY gateway ./gateway
# The gateway itself adds no dependency: all are above.
RUN /build/bin/pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /dist . \
    && /venv/bin/pip install --no-cache-dir --no-deps /dist/llm_gateway-*.whl

FROM python:3.11-slim
# uid and gid 10001, fixed: deploy/kubernetes sets runAsUser/runAsGroup/fsGroup to the same numbers.
RUN groupadd --system --gid 10001 gateway \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/gateway --create-home gateway
COPY --from=build /venv /venv
ENV PATH=/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    GATEWAY_HOST=0.0.0.0 \
    GATEWAY_PORT=8080 \
    GATEWAY_DATABASE_URL=sqlite+aiosqlite:////var/lib/gateway/gateway.db
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd (hadolint DL3066).
USER 10001:10001
WORKDIR /var/lib/gateway
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/healthz').status != 200)"]
CMD ["gateway", "serve"]
