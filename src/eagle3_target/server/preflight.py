"""What `eagle3-target serve` checks before it loads a model: each failure is one line for the user.

A bad flag found after a multi-minute model load (or as a traceback in the load thread, on every rank
of a split replica) costs a GPU pod a restart loop; these checks take a second and name the flag to fix.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from eagle3_target.protocol.engine_spec import PIPELINE, TENSOR
from eagle3_target.protocol.engines import engine, engines
from eagle3_target.protocol.model_info import default_aux_layer_ids, validate_aux_layer_ids

from .options import UsageError
from .parallel import ParallelLayout


def installed(name: str) -> bool:
    """Whether engine ``name``'s package (if it has one) can be imported here."""
    package = engine(name).package
    return package is None or importlib.util.find_spec(package) is not None


def local_folder(model: str | None) -> bool:
    return model is not None and Path(model).is_dir()


def check_engine(name: str) -> None:
    package = engine(name).package
    if not installed(name):
        raise UsageError(
            f"--engine {name} needs {package}, which is not installed: "
            f"pip install 'eagle3-target[server,{package}]' (see docs/{package}.md)"
        )


def refuse_image_text(name: str, model: str | None, trust_remote_code: bool, split: bool = False) -> None:
    """Only an engine whose table entry says image_text loads image-text checkpoints, on one device: any
    other engine, or a split replica, refuses one from its config alone."""
    can = engine(name).image_text
    if (can and not split) or model is None:
        return
    from .runners.hf_vlm import is_image_text, read_config

    try:
        config = read_config(model, trust_remote_code)
    except (OSError, ValueError):
        return  # num_hidden_layers() names the unreadable config
    if is_image_text(config) and can:
        raise UsageError(
            f"--model {model} is an image-text model ({config.model_type}); a replica split over ranks "
            "serves text-only targets: drop --tensor-parallel-size, --pipeline-parallel-size and --nnodes"
        )
    if is_image_text(config):
        raise UsageError(
            f"--model {model} is an image-text model ({config.model_type}); "
            f"--engine {name} serves text-only targets: use --engine {_with('image_text')}"
        )


def check_device(device: str) -> None:
    import torch

    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise UsageError(f"--device {device!r} is not a torch device (e.g. cpu, cuda:0)") from None
    if parsed.type != "cuda":
        return
    if not torch.cuda.is_available():
        raise UsageError(
            f"--device {device}: this torch ({torch.__version__}) has no usable CUDA; "
            "use --device cpu or install a CUDA build of torch"
        )
    if parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible")


def check_model(model: str | None) -> None:
    """A path that does not exist is an error here, not a hub lookup that fails with a repo-id message."""
    if model is None or Path(model).is_dir():
        return
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    looks_like_path = model.startswith(("/", "./", "../", "~")) or Path(model).exists()
    try:
        validate_repo_id(model)
    except HFValidationError:
        looks_like_path = True
    if looks_like_path:
        raise UsageError(f"--model {model}: no such directory (give a local model directory or a hub id)")
    check_hub_model(model)


HUB_PROBE_TIMEOUT = 5.0  # one request, no retries: a typo answers in seconds, not in a minute of backoff


def check_hub_model(model: str) -> None:
    """A hub id that is neither in the local cache nor on the hub is one line within seconds: transformers'
    own lookup retries each file with backoff for a minute when the hub cannot be reached, then speaks of
    the network only. A name with no ``org/`` is most often a local folder's typo, so the line says there is
    no such folder too."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(model, "config.json"), str):
        return  # cached: transformers loads it without the hub
    folder = f"there is no local folder {model!r}, and " if "/" not in model else ""
    if constants.HF_HUB_OFFLINE:
        raise UsageError(f"--model {model}: {folder}the hub cache has no such model (HF_HUB_OFFLINE is set)")
    try:
        HfApi().model_info(model, timeout=HUB_PROBE_TIMEOUT)
    except RepositoryNotFoundError:
        raise UsageError(
            f"--model {model}: {folder}the hub has no model {model} (a private or gated one needs $HF_TOKEN)"
        ) from None
    except Exception as exc:  # noqa: BLE001 -- whatever the network says, it is this one line
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(
            f"--model {model}: {folder}the hub cannot be reached to look for it ({reason})"
        ) from None


def model_config(model: str | None, trust_remote_code: bool):
    """The model's text config alone: a few kB, never the weights."""
    if model is None:
        from transformers import LlamaConfig

        from .runners.tiny import TINY_LLAMA

        return LlamaConfig(**TINY_LLAMA)
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"--model {model}: cannot read its config: {first_line}") from None
    return config.get_text_config()


def check_aux_layer_ids(ids: list[int] | None, layers: int) -> None:
    if ids is None:
        ids = default_aux_layer_ids(layers)
        if len(set(ids)) != 3 or min(ids) < 0:
            raise UsageError(
                f"the model has {layers} layers, so the default aux layers {ids} are not three distinct "
                f"layers: set --aux-layer-ids to three distinct ids in 0..{layers - 1}"
            )
        return
    try:
        validate_aux_layer_ids(ids, layers)
    except ValueError as exc:
        raise UsageError(f"--aux-layer-ids: {exc}") from None


def _with(what: str) -> str:
    """The engines whose table entry has ``what``, for a refusal's advice."""
    return " or ".join(name for name, e in engines().items() if getattr(e, what))


def check_parallel(name: str, layout: ParallelLayout, config=None) -> None:
    """Raise UsageError, one line, for a layout engine ``name`` cannot honour or ``config`` cannot be split by."""
    if not 0 <= layout.node_rank < layout.nnodes:
        raise UsageError(
            f"--node-rank {layout.node_rank} is outside 0..{layout.nnodes - 1} (--nnodes {layout.nnodes})"
        )
    if layout.single:
        return
    spec = engine(name)
    if not spec.splits:
        raise UsageError(
            f"--engine {name} runs one device per replica: drop --tensor-parallel-size, "
            f"--pipeline-parallel-size and --nnodes (use --engine {_with('splits')} to split a model)"
        )
    if spec.gpu_only:
        _check_one_node_gpus(name, layout)
    if layout.pipeline_parallel_size > 1 and not spec.can(PIPELINE):
        raise UsageError(
            f"--engine {name} has no pipeline parallel: use --tensor-parallel-size "
            f"{layout.world_size} or --engine {_with('both_at_once')}"
        )
    if layout.tensor_parallel_size > 1 and not spec.can(TENSOR):
        raise UsageError(f"--engine {name} has no tensor parallel: use --pipeline-parallel-size")
    if layout.tensor_parallel_size > 1 and layout.pipeline_parallel_size > 1 and not spec.both_at_once:
        raise UsageError(
            f"--engine {name} splits a model one way at a time: give --tensor-parallel-size or "
            f"--pipeline-parallel-size, not both (or use --engine {_with('both_at_once')})"
        )
    if layout.nnodes > 1 and not spec.nodes:
        raise UsageError(f"--engine {name} cannot span nodes: drop --nnodes or use --engine {_with('nodes')}")
    if layout.world_size % layout.nnodes:
        raise UsageError(
            f"--nnodes {layout.nnodes} does not divide the replica's {layout.world_size} ranks "
            "(tensor x pipeline parallel size): every node runs the same number of ranks"
        )
    if config is not None:
        _check_config(name, layout, config)


def _check_one_node_gpus(name: str, layout: ParallelLayout) -> None:
    """An engine that splits a replica over the GPUs of one node, by tensor parallel only (sglang)."""
    if layout.pipeline_parallel_size > 1 or layout.nnodes > 1:
        raise UsageError(
            f"--engine {name} splits a replica by --tensor-parallel-size over one node's GPUs: drop "
            f"--pipeline-parallel-size and --nnodes (use --engine {_with('both_at_once')} for those)"
        )
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus < layout.tensor_parallel_size:
        cpu = " or ".join(n for n, e in engines().items() if e.splits and not e.gpu_only)
        raise UsageError(
            f"--engine {name} --tensor-parallel-size {layout.tensor_parallel_size} needs as many CUDA GPUs, "
            f"and this machine has {gpus} (on CPUs use --engine {cpu})"
        )


def _check_config(name: str, layout: ParallelLayout, config) -> None:
    tp, pp = layout.tensor_parallel_size, layout.pipeline_parallel_size
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    # vLLM copies each KV head to tp / kv_heads ranks when there are fewer KV heads than ranks
    replicated = engine(name).copies_kv_heads and tp % kv_heads == 0
    if heads and tp > 1 and (heads % tp or (kv_heads % tp and not replicated)):
        raise UsageError(
            f"--tensor-parallel-size {tp} must divide both the model's {heads} attention heads and its "
            f"{kv_heads} key-value heads"
        )
    layers = getattr(config, "num_hidden_layers", None)
    if layers and pp > layers:
        raise UsageError(f"--pipeline-parallel-size {pp} is larger than the model's {layers} layers")
