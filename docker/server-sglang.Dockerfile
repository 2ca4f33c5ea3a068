# The target server image for the sglang engine (`eagle3-target serve --engine sglang`), CUDA only.
# SGLang 0.5.9 pins its own torch (2.9.1, PyPI's CUDA 12.8 build) and transformers (4.57.1), so this image is
# separate from docker/server.Dockerfile. Build it with `scripts/build-images.sh sglang` (docker or podman).
# One stage on the CUDA devel image: SGLang's kernels (Triton, FlashInfer) compile on first use at run time,
# which needs nvcc, a C compiler and Python's headers in the final image anyway.
FROM nvidia/cuda:12.8.1-devel-ubuntu24.04
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Ubuntu's Python 3.12 with headers and venv; apt versions follow the pinned CUDA base's Ubuntu release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-dev python3-venv gcc g++ libnuma1 \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src src
# the sglang extra brings SGLang's own torch and transformers pins; sources go once installed
RUN pip install "./[server,client,sglang]" && rm -rf /src

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp HF_HOME=/var/cache/eagle3-target/huggingface
# The operator runs pods as uid 1000 with a read-only root filesystem; /tmp (where Triton and FlashInfer keep
# their compiled kernels) and the model cache are volumes. Ubuntu's images already hold a uid 1000 ("ubuntu").
RUN if id ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi \
    && useradd --uid 1000 --no-create-home --home-dir /tmp eagle3
USER 1000:1000
WORKDIR /tmp
EXPOSE 8001
ENTRYPOINT ["eagle3-target"]
CMD ["serve", "--engine", "sglang", "--device", "cuda", "--host", "0.0.0.0", "--port", "8001"]
