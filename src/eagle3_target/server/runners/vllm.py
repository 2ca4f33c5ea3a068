"""vLLM runner: one prefill of every row through an in-process vLLM engine, states captured by hooks.

vLLM packs the tokens of all rows flat; the capture (vllm_capture.py) checks the captured token ids
and positions against the batch sent, so a reordered or chunked schedule is an error, never wrong
data. The engine is built by vllm_engine.py. vLLM is optional: nothing here imports it until a
runner is loaded.
"""

from __future__ import annotations

import gc
import itertools
import logging

import torch

from eagle3_target.protocol.encodings import ENCODINGS, EXACT_ENCODINGS
from eagle3_target.protocol.features import WEIGHT_INPUT_EMBEDDINGS, WEIGHT_NAMES
from eagle3_target.protocol.model_info import defining_config

from .. import sampling
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
from .hf import load_tokenizer
from .rows import row_lengths, stack_rows
from .vllm_capture import (
    FINAL,
    LOGITS,
    drop_capture,
    install_capture,
    merge,
    plain_head,
    row_positions,
    take_capture,
    watch_layers,
)
from .vllm_engine import check_requirements, engine_args, gpu_ids, start_engine
from .vllm_generate import VLLMDecoding
from .vllm_ranks import Heartbeat, executor_alive, follow
from .vllm_weights import VLLMWeights

log = logging.getLogger(__name__)

# vLLM's process groups are global to a process: an in-process engine's shutdown destroys them under
# any other engine still running there, whose next step fails.
ONE_PER_PROCESS = "one vllm engine per process: close the vllm runner already loaded here first"


def checked_engine_args(model, dtype, device, trust_remote_code, parallel, limits: dict) -> dict:
    """vLLM's engine arguments for this replica, once the engine can run here and a model is named."""
    check_requirements(device)
    if model is None:
        raise ValueError("the vllm engine needs --model (a local directory or hub id)")
    return engine_args(
        model,
        dtype=resolve_dtype(dtype, device),
        device=device,
        trust_remote_code=trust_remote_code,
        parallel=parallel,
        **limits,
    )


class VLLMRunner(VLLMWeights, FinalHiddenRunner):
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
        parallel: ParallelLayout,
        tokenizer=None,
        engine_args: dict | None = None,
    ):
        from vllm import SamplingParams

        self.llm, self.tokenizer = llm, tokenizer  # the tokenizer: for the /v1 endpoints (None: they refuse)
        self.engine_args = (
            engine_args  # what the engine was built from: an evaluation engine's too (speculative/)
        )
        self.parallel = parallel
        self.max_batch_tokens = max_batch_tokens
        model_config = llm.llm_engine.model_config
        self.max_model_len = int(model_config.max_model_len)
        self.max_rows = int(llm.llm_engine.vllm_config.scheduler_config.max_num_seqs)
        hf_config = model_config.hf_config
        text = hf_config.get_text_config()
        plain = next(p for p in llm.collective_rpc(plain_head) if p is not None)  # the last stage's
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
            parallel={} if parallel.single else parallel.describe(),
        )
        # One token sampled greedily per row: the prefill is what we want, the sample is thrown away.
        self.sampling = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        llm.collective_rpc(install_capture, args=(self.info.aux_layer_ids,))
        self.executor = llm.llm_engine.engine_core.engine_core.model_executor
        # The other nodes' beats: a node gone makes this replica unhealthy (vLLM would wait on it forever).
        others = list(range(1, parallel.nnodes))
        self.heartbeat = Heartbeat(parallel, watched=others) if others else None
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
        """The head of a replica (node-rank 0): its engine, every rank of this node started here."""
        if not parallel.leader:
            raise ValueError("node-rank > 0 follows the head (VLLMRunner.follow); only node-rank 0 loads")
        limits = dict(gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len)
        limits.update(max_batch_tokens=max_batch_tokens, max_rows=max_rows)
        args = checked_engine_args(model, dtype, device, trust_remote_code, parallel, limits)
        if VLLMRunner.loaded:
            raise ValueError(ONE_PER_PROCESS)
        llm = start_engine(**args)
        log.info("loaded %s with vLLM (%s) on %s, %s", model, args["dtype"], device, parallel.describe())
        gpus = gpu_ids(device, parallel.tensor_parallel_size)
        return cls(
            llm,
            name=model,
            aux_layer_ids=aux_layer_ids,
            dtype=resolve_dtype(dtype, device),
            device="cpu" if gpus is None else f"cuda:{gpus[0]}",
            max_batch_tokens=max_batch_tokens,
            parallel=parallel,
            tokenizer=load_tokenizer(model, trust_remote_code),
            engine_args=args,
        )

    @classmethod
    def follow(
        cls,
        model: str | None = None,
        *,
        dtype: str = "auto",
        device: str = "cpu",
        aux_layer_ids: list[int] | None = None,
        trust_remote_code: bool = False,
        parallel: ParallelLayout,
        gpu_memory_utilization: float = 0.6,
        max_model_len: int | None = None,
        max_batch_tokens: int = 16384,
        max_rows: int = 256,
    ) -> None:
        """A node-rank > 0: run this node's ranks of the replica until its head is gone (returns) or one of
        them dies (RuntimeError). The head's forwards drive them; nothing is served from here."""
        del aux_layer_ids  # the head's hooks reach these ranks through collective_rpc
        if parallel.leader:
            raise ValueError("node-rank 0 heads the replica (VLLMRunner.load); only node-ranks > 0 follow")
        limits = dict(gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len)
        limits.update(max_batch_tokens=max_batch_tokens, max_rows=max_rows)
        follow(checked_engine_args(model, dtype, device, trust_remote_code, parallel, limits), parallel)

    def healthy(self) -> bool:
        """False once any rank of the replica died: a worker process here, or another node."""
        if self.llm is None:
            return False
        return executor_alive(self.executor) and (self.heartbeat is None or self.heartbeat.alive())

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
        parts = self.llm.collective_rpc(take_capture, args=(flat, row_positions(lengths), want.logits))
        got = merge(parts, list(want.layers))
        layers = torch.cat([got[i] for i in want.layers], dim=-1) if want.layers else None
        rows = [(layers, True), (got[FINAL], want.final_hidden), (got.get(LOGITS), want.logits)]
        return Captured(
            *(stack_rows(t.to(input_ids.device), mask) if t is not None and on else None for t, on in rows)
        )

    def start_generation(self, prompt_ids: list[int], params: sampling.SamplingParams) -> VLLMDecoding:
        return VLLMDecoding(self.llm, prompt_ids, params)

    def close(self) -> None:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        if self.heartbeat is not None:
            self.heartbeat.stop()
        if executor_alive(self.executor):  # a failed executor takes no more calls
            self.llm.collective_rpc(drop_capture)
        self.llm.llm_engine.engine_core.shutdown()
        self.llm = None
        VLLMRunner.loaded = False
        gc.collect()
        cleanup_dist_env_and_memory()
