# One image for all three salon services; docker-compose.yml picks the service by its command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

# A C compiler (with OpenMP) for the CPU int8 GEMM kernels, built on first use (salon/kernels/cpu/w8a8_acc.c).
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev libgomp1 \
    && rm -rf /var/lib/apt/lists/*

# torch first, pinned: pass PIP_INDEX_URL/PIP_EXTRA_INDEX_URL as build args to choose a CPU-only or CUDA build.
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
COPY constraints.txt ./
RUN pip install -c constraints.txt "torch==2.13.0"
COPY pyproject.toml README.md ./
COPY salon ./salon
COPY protos ./protos
RUN pip install -c constraints.txt .

# The services run as an unprivileged user (uid 10001, as the Kubernetes manifests expect). Its home
# holds the converted model and the CPU kernels (a private 0700 cache: salon/kernels/cpu/native.py loads
# code only from such a place). Under /certs, compose's `certs` step writes the CA and the stack's secrets
# (/certs/ca) and what each role may hold (/certs/<role>): volumes mounted there start owned by uid 10001, 0700.
RUN groupadd --gid 10001 salon && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/salon salon \
    && mkdir -p /certs/ca /certs/gateway /certs/engine /certs/kvstore \
    && chown -R salon:salon /certs && chmod -R 0700 /certs
USER 10001:10001
ENV HOME=/home/salon

# Convert the default model to the int8 checkpoint and build the CPU kernels at build time so engines start fast.
RUN salon convert && python -m salon.kernels.cpu.native

EXPOSE 50051
CMD ["salon", "up"]
