# Seawall on CPU: one image runs any service, named by its module (the ENTRYPOINT is `python -m`):
#
#   docker build -t seawall:cpu .
#   docker run --rm -p 8000:8000 -p 50051:50051 seawall:cpu                        # the scheduler
#   docker run --rm seawall:cpu services.prefill --scheduler HOST:50051 --port 50061 --advertise NAME
#   docker run --rm seawall:cpu seawall model path                                 # the built-in model
#
# docker-compose.yml wires the whole mesh; Dockerfile.cuda is the NVIDIA variant.
FROM python:3.11-slim

# SEAWALL_HOST: services listen on every interface of the container (their --host flag still overrides it).
# SEAWALL_CACHE_DIR: the built-in model is created there on first use; mount a volume to share it.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SEAWALL_HOST=0.0.0.0 \
    SEAWALL_CACHE_DIR=/cache

# A C compiler: the engine builds its fused CPU kernels (services/engine/cpu_kernels) for the CPU it runs on,
# once, into $SEAWALL_CACHE_DIR; without one it falls back to plain torch ops (same tokens, slower steps).
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

# torch from the CPU index first (the default index would bring the CUDA build and its libraries).
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
# hadolint ignore=DL3013
RUN pip install --index-url "${TORCH_INDEX}" "${TORCH_SPEC}"

WORKDIR /app
# The dependencies in their own layer, so editing the code does not reinstall them.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt
COPY seawall ./seawall
COPY services ./services
RUN pip install --no-deps . \
    && useradd --create-home --uid 10001 seawall \
    && mkdir -p /cache /models /var/lib/seawall/kvcache \
    && chown seawall:seawall /cache /var/lib/seawall/kvcache

# Named volumes mounted on these start with the image's owner, so the non-root user can write them.
VOLUME ["/cache"]
USER 10001:10001

# 50051: scheduler gRPC; 8000: OpenAI HTTP API (and the scheduler's /metrics). Workers and the kvcache listen
# on the port their --port flag names.
EXPOSE 50051 8000
# gRPC health (grpc.health.v1) of the service at $SEAWALL_HEALTH_ADDRESS (default 127.0.0.1:50051, the
# scheduler); set it when running a worker alone, or override the healthcheck as docker-compose.yml does.
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-m", "seawall.healthcheck"]

ENTRYPOINT ["python", "-m"]
CMD ["services.scheduler"]
