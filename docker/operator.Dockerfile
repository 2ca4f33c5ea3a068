# The operator image (`eagle3-target operator`): kopf and kr8s, no torch.
# Build it with scripts/build-images.sh (docker or podman).
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# One virtual environment that the final stage copies whole: no pip cache, sources or build backend.
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src src
# the check fails the build if the operator's imports ever pull in torch
RUN pip install "./[operator]" \
    && python -c "import sys, eagle3_target.operator.handlers; assert 'torch' not in sys.modules"

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH
COPY --from=build /opt/venv /opt/venv
RUN useradd --uid 1000 --no-create-home eagle3
USER 1000:1000
EXPOSE 8080
ENTRYPOINT ["eagle3-target", "operator"]
CMD ["--all-namespaces"]
