# One image for all three salon services; docker-compose.yml picks the service by its command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

# A C compiler (with OpenMP) for the CPU int8 GEMM kernels, built on first use (kernels/cpu/w8a8_acc.c).
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev libgomp1 \
    && rm -rf /var/lib/apt/lists/*

# torch first, pinned: pass PIP_INDEX_URL/PIP_EXTRA_INDEX_URL as build args to choose a CPU-only or CUDA build.
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
RUN pip install "torch==2.13.0"
COPY pyproject.toml README.md ./
COPY salon ./salon
COPY services ./services
COPY kernels ./kernels
COPY bench ./bench
COPY protos ./protos
RUN pip install .

# Convert the default model to the int8 checkpoint and build the CPU kernels at build time so engines start fast.
RUN salon convert && python -m kernels.cpu.native

EXPOSE 50051 50061 50071 9100
CMD ["salon", "up"]
