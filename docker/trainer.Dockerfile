# The draft trainer image (`eagle3-target train-draft`: NeMo AutoModel's EAGLE-3 recipe against the fleet,
# plus `probe` and `bench`), CUDA GPUs only. nemo-automodel 0.7.0 pins its own transformers (5.18.0) and
# takes PyPI's CUDA torch, and a trainer needs no model runtime, so this image installs the client and NeMo
# only, never the server extra. Build it with `scripts/build-images.sh trainer` (docker or podman); CI lints
# it, never builds it (too large; the NeMo tests run on CPU with nemo-automodel installed --no-deps).
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Ubuntu's Python 3.12 with headers and venv, and a C compiler: Triton (torch.compile, NeMo's kernels) builds
# a small launcher for each kernel on first use. apt versions follow the pinned CUDA base's Ubuntu release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-dev python3-venv gcc \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src src
# the nemo extra brings nemo-automodel 0.7.0 with its own pins (transformers, torch, its kernels);
# sources go once installed
RUN pip install "./[client,nemo]" && rm -rf /src

# HOME is the pod's /tmp volume: the Hugging Face and Triton caches land there under a read-only root.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
# Trainer pods run as uid 1000 (manifests/example-trainer-job.yaml). Ubuntu's images already hold a uid
# 1000 ("ubuntu").
RUN if id ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi \
    && useradd --uid 1000 --no-create-home --home-dir /tmp eagle3
USER 1000:1000
WORKDIR /tmp
ENTRYPOINT ["eagle3-target"]
CMD ["train-draft", "--help"]
