#!/usr/bin/env bash
# Build (and optionally push) the project's container images with docker or podman, from the repository root.
#
#   scripts/build-images.sh                      # server and operator images, tagged with the package version
#   scripts/build-images.sh server operator sglang
#   TORCH_VARIANT=cu128 PUSH=1 scripts/build-images.sh server
#
# Images: server   -> $REGISTRY/eagle3-target           (docker/server.Dockerfile, hf engine)
#         operator -> $REGISTRY/eagle3-target-operator  (docker/operator.Dockerfile, no torch)
#         sglang   -> $REGISTRY/eagle3-target-sglang    (docker/server-sglang.Dockerfile, CUDA only)
#         vllm     -> $REGISTRY/eagle3-target-vllm      (docker/server-vllm.Dockerfile, CUDA only)
#         trainer  -> $REGISTRY/eagle3-target-trainer   (docker/trainer.Dockerfile, NeMo AutoModel, CUDA torch)
#         trainer-cpu -> $REGISTRY/eagle3-target-trainer:$TAG-cpu (the same file's `cpu` target: CPU torch, no GPU)
# Environment:
#   CONTAINER_TOOL  a command that takes docker's `build` (and `push`) arguments: docker, podman, or
#                   "bash ../shared/tools/container-base.sh" (podman with the host's pip settings);
#                   default: docker if installed, else podman
#   REGISTRY        image name prefix (default ghcr.io/eagle3-target)
#   TAG             image tag (default: the version in pyproject.toml)
#   TORCH_VARIANT   torch build of the server and trainer-cpu images: cpu (default), cu126, cu128, ... (an index under
#                   https://download.pytorch.org/whl/), or pip (whatever pip's configured index gives)
#   PUSH=1          push each image after it is built
# Prints one line per image built: "built <image>".
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "build-images: $*" >&2; exit 1; }

if [[ -n ${CONTAINER_TOOL:-} ]]; then
  read -ra tool <<<"$CONTAINER_TOOL"
elif command -v docker >/dev/null; then
  tool=(docker)
elif command -v podman >/dev/null; then
  tool=(podman)
else
  die "neither docker nor podman is installed; set CONTAINER_TOOL"
fi
registry=${REGISTRY:-ghcr.io/eagle3-target}
tag=${TAG:-$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')}
case ${TORCH_VARIANT:-cpu} in
  pip) torch_index= ;;
  cpu | cu[0-9]* | rocm[0-9]*) torch_index=https://download.pytorch.org/whl/${TORCH_VARIANT:-cpu} ;;
  *) die "TORCH_VARIANT=$TORCH_VARIANT: expected cpu, cuNNN, rocmN.N or pip" ;;
esac

declare -A dockerfile=(
  [server]=docker/server.Dockerfile [operator]=docker/operator.Dockerfile
  [sglang]=docker/server-sglang.Dockerfile [vllm]=docker/server-vllm.Dockerfile
  [trainer]=docker/trainer.Dockerfile [trainer-cpu]=docker/trainer.Dockerfile
)
declare -A name=(
  [server]=eagle3-target [operator]=eagle3-target-operator
  [sglang]=eagle3-target-sglang [vllm]=eagle3-target-vllm
  [trainer]=eagle3-target-trainer [trainer-cpu]=eagle3-target-trainer
)
# The Dockerfile target an image is built from, where it is not the file's last stage, and its tag's suffix.
declare -A target=([trainer-cpu]=cpu)
declare -A suffix=([trainer-cpu]=-cpu)
images=("$@")
((${#images[@]})) || images=(server operator)
for image in "${images[@]}"; do  # check every name before the first slow build
  [[ -n ${dockerfile[$image]:-} ]] || die "unknown image '$image': expected server, operator, sglang, vllm, trainer or trainer-cpu"
  [[ -f ${dockerfile[$image]} ]] || die "$image: ${dockerfile[$image]} does not exist"
done

for image in "${images[@]}"; do
  ref=$registry/${name[$image]}:$tag${suffix[$image]:-}
  args=(build -f "${dockerfile[$image]}" -t "$ref" --label "org.opencontainers.image.version=$tag")
  [[ -n ${target[$image]:-} ]] && args+=(--target "${target[$image]}")
  [[ $image == server || $image == trainer-cpu ]] && args+=(--build-arg "TORCH_INDEX_URL=$torch_index")
  "${tool[@]}" "${args[@]}" . || die "$image: '${tool[*]} build' failed (its output is above)"
  echo "built $ref"
  if [[ ${PUSH:-0} == 1 ]]; then
    "${tool[@]}" push "$ref" || die "$image: '${tool[*]} push $ref' failed"
  fi
done
