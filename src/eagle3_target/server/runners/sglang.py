"""SGLang runner: one extend forward of a standalone SGLang ModelRunner, on one CUDA GPU per rank.

Stock SGLang keeps the logits of each row's last position only; the runner swaps the
model's LogitsProcessor for a head that keeps every position and returns the captured
EAGLE-3 aux states. SGLang packs the tokens of all rows flat, so the outputs are
re-stacked into [B, S, *] with zeros past each row's length.

SGLang is optional and GPU-only: nothing here imports it until a runner is loaded.
"""

from __future__ import annotations

import gc
import importlib.util
import itertools
import logging

import torch
from torch import nn

from eagle3_target.protocol.features import CAN_DRAFT_PROBS, CAN_LAYERS, CAN_LOGITS, WEIGHT_INPUT_EMBEDDINGS
from eagle3_target.protocol.model_info import defining_config

from ..errors import InvalidInput, TooLarge
from .base import Capture, Captured, ForwardInputs, RunnerInfo, refuse_packing, resolve_dtype
from .rows import row_lengths, stack_rows
from .sglang_setup import build_model_runner, build_server_args, import_sglang

log = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.9"  # the version whose internals this module tracks (pinned by the `sglang` extra)
INSTALL_HINT = (
    f"the sglang engine needs SGLang {SGLANG_VERSION}: pip install 'eagle3-target[sglang]' in a separate "
    "server image (SGLang pins its own torch and transformers)"
)
NO_GPU = "the sglang engine needs a CUDA GPU, and torch sees none"


class SGLangUnavailable(RuntimeError):
    """SGLang or a CUDA GPU is missing: raised before anything heavy is loaded."""


def check_requirements(device: str) -> None:
    """Fail at once, naming everything that is missing, before SGLang or a model is loaded."""
    problems = []
    if importlib.util.find_spec("sglang") is None:
        problems.append(INSTALL_HINT)
    if not torch.cuda.is_available():
        problems.append(NO_GPU)
    elif torch.device(device).type != "cuda":
        problems.append(f"the sglang engine runs on a CUDA GPU: pass --device cuda or cuda:N, not {device!r}")
    if problems:
        raise SGLangUnavailable("; ".join(problems))


def concat_aux(captured: list[torch.Tensor], aux_layer_ids: list[int]) -> torch.Tensor:
    """SGLang captures in layer order; concatenate in the order the client asked for, as the HF runner does."""
    if len(captured) != len(aux_layer_ids):
        raise RuntimeError(
            f"SGLang captured {len(captured)} aux hidden states, expected {len(aux_layer_ids)}"
        )
    by_layer = dict(zip(sorted(aux_layer_ids), captured, strict=False))
    return torch.cat([by_layer[i] for i in aux_layer_ids], dim=-1)


class AllPositionsHead(nn.Module):
    """Stands in for a model's LogitsProcessor: logits for every token, plus the aux states.

    Reuses the wrapped processor's own lm-head path (scaling, soft-capping, vocab padding removed).
    """

    def __init__(self, inner: nn.Module, sgl, aux_layer_ids: list[int]):
        super().__init__()
        self.inner = inner
        self.sgl = sgl
        self.aux_layer_ids = list(aux_layer_ids)

    def forward(self, input_ids, hidden_states, lm_head, logits_metadata, aux_hidden_states=None, *_, **__):
        if isinstance(logits_metadata, self.sgl.ForwardBatch):
            logits_metadata = self.sgl.LogitsMetadata.from_forward_batch(logits_metadata)
        logits = self.inner._get_logits(hidden_states, lm_head, logits_metadata)
        aux = concat_aux(list(aux_hidden_states or []), self.aux_layer_ids)
        return self.sgl.LogitsProcessorOutput(next_token_logits=logits, hidden_states=aux)


def install_head(sgl, model: nn.Module, aux_layer_ids: list[int], num_hidden_layers: int) -> None:
    if not hasattr(model, "set_eagle3_layers_to_capture"):
        raise ValueError(
            f"SGLang's {type(model).__name__} cannot capture EAGLE-3 aux hidden states; use --engine hf"
        )
    if max(aux_layer_ids) >= num_hidden_layers - 1:
        # SGLang captures a layer's output at the next layer's input: the last layer has none.
        raise ValueError(
            f"the sglang engine cannot capture the last layer ({num_hidden_layers - 1}); "
            f"choose aux layer ids below it, got {aux_layer_ids}"
        )
    model.logits_processor = AllPositionsHead(model.logits_processor, sgl, aux_layer_ids)
    model.set_eagle3_layers_to_capture(list(aux_layer_ids))


def extend_batch(sgl, runner, rows: list[list[int]]):
    """The ForwardBatch SGLang's scheduler would build to prefill ``rows`` from an empty cache."""
    params = sgl.SamplingParams(temperature=0, max_new_tokens=1)
    reqs = []
    for i, ids in enumerate(rows):
        req = sgl.Req(rid=str(i), origin_input_text="", origin_input_ids=ids, sampling_params=params)
        req.fill_ids = req.origin_input_ids
        req.logprob_start_len = -1
        req.set_extend_input_len(len(req.fill_ids) - len(req.prefix_indices))
        reqs.append(req)
    allocator = runner.token_to_kv_pool_allocator
    cache = sgl.TreeCacheNamespace(
        page_size=runner.server_args.page_size, device=runner.device, token_to_kv_pool_allocator=allocator
    )
    batch = sgl.ScheduleBatch.init_new(
        reqs=reqs,
        req_to_token_pool=runner.req_to_token_pool,
        token_to_kv_pool_allocator=allocator,
        tree_cache=cache,
        model_config=runner.model_config,
        enable_overlap=False,
        spec_algorithm=sgl.SpeculativeAlgorithm.NONE,
    )
    batch.prepare_for_extend()
    return sgl.ForwardBatch.init_new(batch.get_model_worker_batch(), runner)


def check_capacity(runner, lengths: list[int]) -> None:
    limits = (
        ("rows", len(lengths), runner.req_to_token_pool.size),
        ("tokens in the longest row", max(lengths), runner.req_to_token_pool.max_context_len),
        ("tokens in all", sum(lengths), runner.max_total_num_tokens),
    )
    for what, asked, limit in limits:
        if asked > limit:
            raise TooLarge("batch_too_large", f"{what}: {asked} is over this server's limit of {limit}")


def embedding_weight(model: nn.Module) -> torch.Tensor:
    if hasattr(model, "get_input_embeddings"):
        return model.get_input_embeddings().weight
    return model.model.embed_tokens.weight


# What a load takes, and its defaults
LOAD_DEFAULTS = dict(
    model=None,
    dtype="auto",
    device="cuda",
    aux_layer_ids=None,
    trust_remote_code=False,
    mem_fraction_static=0.5,
)


def checked_options(options: dict) -> dict:
    """The load options with LOAD_DEFAULTS, once SGLang, a GPU and a model are known to be there."""
    unknown = set(options) - set(LOAD_DEFAULTS)
    if unknown:
        raise TypeError(f"the sglang engine takes no {', '.join(sorted(unknown))}")
    options = {**LOAD_DEFAULTS, **options}
    check_requirements(options["device"])
    if options["model"] is None:
        raise ValueError("the sglang engine needs --model (a local directory or hub id)")
    return options


class SGLangRunner:
    def __init__(self, sgl, model_runner, *, name: str, aux_layer_ids: list[int] | None, dtype: torch.dtype):
        self.sgl = sgl
        self.model_runner = model_runner
        config = model_runner.model_config
        model = model_runner.model
        self.info = RunnerInfo.build(
            model=name,
            engine="sglang",
            num_hidden_layers=int(config.num_hidden_layers),
            hidden_size=int(config.hidden_size),
            vocab_size=int(config.vocab_size),
            aux_layer_ids=aux_layer_ids,
            dtype=dtype,
            device=str(embedding_weight(model).device),
            config=defining_config(config.hf_config.to_diff_dict()),
            # SGLang hooks its aux layers once, at load; the final normed states never leave its model.
            features=(CAN_LAYERS, CAN_LOGITS, CAN_DRAFT_PROBS),
            weights=(WEIGHT_INPUT_EMBEDDINGS,),
        )
        install_head(sgl, model, self.info.aux_layer_ids, self.info.num_hidden_layers)

    @classmethod
    def load(cls, model: str | None = None, **options) -> SGLangRunner:
        """One GPU's runner (a split replica: sglang_parallel.load); ``options`` as LOAD_DEFAULTS."""
        return cls.build(**checked_options({"model": model, **options}))

    @classmethod
    def build(cls, *, model: str, dtype: str, device: str, tp_rank: int = 0, tp_size: int = 1, **options):
        """This rank's runner: ``device`` is its GPU, ``tp_rank`` its place among ``tp_size`` ranks."""
        torch_dtype = resolve_dtype(dtype, device)
        gpu_id = torch.device(device).index or 0
        sgl = import_sglang()
        server_args = build_server_args(
            sgl,
            model,
            dtype=torch_dtype,
            gpu_id=gpu_id - tp_rank,  # the replica's first GPU: rank r runs on the r-th after it
            mem_fraction_static=options["mem_fraction_static"],
            trust_remote_code=options["trust_remote_code"],
            tp_size=tp_size,
        )
        model_runner = build_model_runner(sgl, server_args, gpu_id, tp_rank)
        log.info(
            "loaded %s with SGLang (%s) on cuda:%d, rank %d of %d",
            model,
            torch_dtype,
            gpu_id,
            tp_rank,
            tp_size,
        )
        return cls(sgl, model_runner, name=model, aux_layer_ids=options["aux_layer_ids"], dtype=torch_dtype)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        mask = attention_mask.bool()
        lengths = [n for n in row_lengths(mask, "sglang").tolist() if n]
        tokens = input_ids[mask].tolist()  # one device-to-host copy, rows back to back
        bounds = list(itertools.accumulate(lengths, initial=0))
        rows = [tokens[start:end] for start, end in itertools.pairwise(bounds)]
        if not rows:
            shape, device = input_ids.shape, input_ids.device
            logits = torch.zeros(*shape, self.info.vocab_size, device=device)
            return logits, torch.zeros(
                *shape, 3 * self.info.hidden_size, dtype=self.info.dtype, device=device
            )
        runner = self.model_runner
        check_capacity(runner, lengths)
        try:
            output = runner.forward(extend_batch(self.sgl, runner, rows)).logits_output
        finally:
            # Every batch starts from an empty cache: give back the KV slots this one took.
            runner.req_to_token_pool.clear()
            runner.token_to_kv_pool_allocator.clear()
        return stack_rows(output.next_token_logits, mask), stack_rows(output.hidden_states, mask)

    def capture(self, inputs: ForwardInputs, want: Capture) -> Captured:
        """forward's logits and aux layers, in the asked order: SGLang can give nothing else."""
        refuse_packing(inputs, "sglang")
        ids = self.info.aux_layer_ids
        other = [i for i in want.layers if i not in ids]
        if other or want.final_hidden:
            asked = "the final hidden state" if want.final_hidden else f"layers {other}"
            raise InvalidInput(
                "feature_not_offered",
                f"the sglang engine captures its aux layers {ids} (--aux-layer-ids) and logits only, not {asked}",
            )
        logits, aux = self.forward(inputs.input_ids, inputs.attention_mask)
        by_layer = dict(zip(ids, aux.split(self.info.hidden_size, dim=-1), strict=True))
        layers = torch.cat([by_layer[i] for i in want.layers], dim=-1) if want.layers else None
        return Captured(hidden_states=layers, logits=logits if want.logits else None)

    def weight(self, name: str) -> torch.Tensor:
        return self.input_embeddings()

    def input_embeddings(self) -> torch.Tensor:
        weight = embedding_weight(self.model_runner.model).detach()
        if self.model_runner.tp_size > 1:  # each rank holds its slice of the rows: all of them take part
            weight = self.sgl.tensor_model_parallel_all_gather(weight, dim=0)
        # SGLang pads the embedding rows to a multiple of 64; the client wants the real vocabulary.
        return weight[: self.info.vocab_size]

    def close(self) -> None:
        self.model_runner = None
        gc.collect()
        self.sgl.cleanup_dist_env_and_memory()
        torch.cuda.empty_cache()
