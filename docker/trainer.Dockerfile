# The draft trainer image (`eagle3-target train-draft`: NeMo AutoModel's draft recipes against the fleet,
# plus `probe`, `bench` and `precompute`). A trainer needs no model runtime, so it installs the client and NeMo only,
# never the server extra. Two targets; build them with scripts/build-images.sh (docker or podman):
#   cpu   `scripts/build-images.sh trainer-cpu`: python:3.11-slim and CPU torch, for trying the Kubernetes
#         quickstarts without a GPU. Its first layers are docker/server.Dockerfile's, instruction for
#         instruction, so a builder that has built the server image reuses its torch layer.
#   cuda  the last stage, the default: `scripts/build-images.sh trainer`. nemo-automodel 0.7.0 pins its own
#         transformers (5.18.0); PyPI's CUDA torch 2.14.1 and torchvision 0.29.1 with the vlm extra, so it also
#         runs the image-text recipes. CI lints it, never builds it (too large); .ci/extras installs the same
#         pip steps (with the server extra) in its vlm venv.
FROM python:3.11-slim AS cpu-build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# As in docker/server.Dockerfile: empty takes torch from pip's configured index, .../whl/cpu the CPU build.
ARG TORCH_INDEX_URL=""
ARG TORCH_VERSION=2.13.0
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN if [ -n "$TORCH_INDEX_URL" ]; then export PIP_INDEX_URL="$TORCH_INDEX_URL"; fi \
    && pip install "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src src
# the torch installed above satisfies NeMo's requirement, so pip keeps the CPU build
RUN pip install "./[client,nemo]"

FROM python:3.11-slim AS cpu
# HOME is the pod's /tmp volume: the Hugging Face and Triton caches land there under a read-only root.
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH HOME=/tmp
COPY --from=cpu-build /opt/venv /opt/venv
# Trainer pods run as uid 1000 (manifests/example-trainer-job.yaml).
RUN useradd --uid 1000 --no-create-home --home-dir /tmp eagle3
USER 1000:1000
WORKDIR /tmp
ENTRYPOINT ["eagle3-target"]
CMD ["train-draft", "--help"]

FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04 AS cuda
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
# the nemo extra brings nemo-automodel 0.7.0 with its own pins (transformers, its kernels); the vlm extra
# (NeMo's image pipeline, for ViSpec stage 2 and DSpark-VLM) wants torchvision, whose PyPI builds pin one torch:
# the pair the vlm extra is tested with goes first (docs/families.md); sources go once installed
RUN pip install "torch==2.14.1" "torchvision==0.29.1" && pip install "./[client,nemo,vlm]" && rm -rf /src

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
