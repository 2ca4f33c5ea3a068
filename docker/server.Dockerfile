# The target server image (`eagle3-target serve`, hf engine): torch, transformers, the server and client CLIs.
# Build it with scripts/build-images.sh (docker or podman), which passes the build arguments below.
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Which torch build: empty takes it from pip's configured index (PyPI's Linux wheel is the CUDA build);
# https://download.pytorch.org/whl/cpu gives the CPU build, .../whl/cu128 a given CUDA build.
ARG TORCH_INDEX_URL=""
ARG TORCH_VERSION=2.13.0
# Everything goes into one virtual environment that the final stage copies whole: no pip cache,
# sources or build backend reach the image.
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first, from its own index, so the server extra does not pull in another build
RUN if [ -n "$TORCH_INDEX_URL" ]; then export PIP_INDEX_URL="$TORCH_INDEX_URL"; fi \
    && pip install "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src src
RUN pip install "./[server,client]"

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH \
    HOME=/tmp HF_HOME=/var/cache/eagle3-target/huggingface
COPY --from=build /opt/venv /opt/venv
# The operator runs pods as uid 1000 with a read-only root filesystem; /tmp and the model cache are volumes.
RUN useradd --uid 1000 --no-create-home --home-dir /tmp eagle3
USER 1000:1000
WORKDIR /tmp
EXPOSE 8001
ENTRYPOINT ["eagle3-target"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8001"]
