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
from .rows import row_lengths, stack_rows
from .vllm_capture import (
    drop_capture,
    embedding_shard,
    install_capture,
    lm_head_rows,
    plain_head,
    row_positions,
    take_capture,
    watch_layers,
    whole_weight,
)
from .vllm_engine import check_requirements, gpu_ids, start_engine

log = logging.getLogger(__name__)

# vLLM's process groups are global to a process: an in-process engine's shutdown destroys them under
# any other engine still running there, whose next step fails.
ONE_PER_PROCESS = "one vllm engine per process: close the vllm runner already loaded here first"


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
        llm = start_engine(
            model,
            dtype=torch_dtype,
            device=device,
            trust_remote_code=trust_remote_code,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            max_batch_tokens=max_batch_tokens,
            max_rows=max_rows,
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
