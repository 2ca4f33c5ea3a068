"""A fake SGLang in sys.modules that behaves like 0.5.9 where the runner touches it.

Like SGLang, it packs the tokens of all rows flat with per-row positions, keeps the
model's vocabulary padded to a multiple of 64, captures an aux state at the *input*
of layer id + 1, in layer order, and its stock LogitsProcessor keeps each row's last
position only. Every layer output is recorded, so tests can check which ones came back.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from torch import nn

VOCAB, PADDED_VOCAB, HIDDEN, LAYERS = 50, 64, 8, 8
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class FakeHFConfig:
    def to_diff_dict(self):
        return {
            "_name_or_path": "/somewhere",
            "dtype": "bfloat16",
            "hidden_size": HIDDEN,
            "vocab_size": VOCAB,
            "num_hidden_layers": LAYERS,
            "model_type": "fake",
        }


@dataclass
class ModelConfig:
    num_hidden_layers: int = LAYERS
    hidden_size: int = HIDDEN
    vocab_size: int = VOCAB
    hf_config: FakeHFConfig = None

    @classmethod
    def from_server_args(cls, server_args):
        return cls(hf_config=FakeHFConfig())


class ServerArgs:
    def __init__(self, model_path, page_size=1, **kwargs):
        self.model_path, self.page_size = model_path, page_size
        self.__dict__.update(kwargs)


@dataclass
class LogitsProcessorOutput:
    next_token_logits: torch.Tensor
    hidden_states: torch.Tensor | None = None


@dataclass
class LogitsMetadata:
    extend_seq_lens: torch.Tensor

    @classmethod
    def from_forward_batch(cls, forward_batch):
        return cls(forward_batch.extend_seq_lens)


class LogitsProcessor(nn.Module):
    def _get_logits(self, hidden_states, lm_head, logits_metadata):
        assert isinstance(logits_metadata, LogitsMetadata)
        return (hidden_states @ lm_head.weight.T)[:, :VOCAB].float()

    def forward(self, input_ids, hidden_states, lm_head, forward_batch, aux_hidden_states=None):
        last = forward_batch.extend_seq_lens.cumsum(0) - 1
        metadata = LogitsMetadata.from_forward_batch(forward_batch)
        return LogitsProcessorOutput(self._get_logits(hidden_states[last], lm_head, metadata))


class Layer(nn.Module):
    """Token-wise MLP plus a causal mean over the token's own row: a leak across rows would show."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, h, seq_lens):
        rows = h.split(seq_lens.tolist())
        mixed = torch.cat([r.cumsum(0) / torch.arange(1, len(r) + 1, dtype=r.dtype)[:, None] for r in rows])
        return h + torch.tanh(self.proj(h)) + 0.5 * mixed


class FakeCausalLM(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        torch.manual_seed(0)
        self.embed_tokens = nn.Embedding(PADDED_VOCAB, HIDDEN)
        self.positions = nn.Embedding(128, HIDDEN)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.lm_head = nn.Linear(HIDDEN, PADDED_VOCAB, bias=False)
        self.logits_processor = LogitsProcessor()
        self.capture_aux_hidden_states = False
        self.layers_to_capture: list[int] = []
        self.layer_outputs: dict[int, torch.Tensor] = {}
        self.to(dtype)

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.capture_aux_hidden_states = True
        self.layers_to_capture = [i + 1 for i in layer_ids]

    def forward(self, input_ids, positions, forward_batch):
        h = self.embed_tokens(input_ids) + self.positions(positions)
        aux = []
        for i, layer in enumerate(self.layers):
            if i in self.layers_to_capture:
                aux.append(h)
            h = layer(h, forward_batch.extend_seq_lens)
            self.layer_outputs[i] = h
        if self.capture_aux_hidden_states:
            return self.logits_processor(input_ids, h, self.lm_head, forward_batch, aux)
        return self.logits_processor(input_ids, h, self.lm_head, forward_batch)


class Pool:
    def __init__(self, size, max_context_len=None):
        self.size, self.max_context_len = size, max_context_len
        self.used = self.clears = 0

    def alloc(self, n):
        assert self.used + n <= self.size, "pool overflow: the runner must check capacity first"
        self.used += n

    def clear(self):
        self.used = 0
        self.clears += 1


class ModelRunner:
    created: list[dict] = []

    def __init__(self, *, model_config, server_args, **kwargs):
        ModelRunner.created.append(dict(kwargs, model_config=model_config, server_args=server_args))
        self.model_config, self.server_args = model_config, server_args
        self.tp_size = kwargs["tp_size"]
        self.device = "cuda"
        self.model = FakeCausalLM(DTYPES[server_args.dtype])
        self.req_to_token_pool = Pool(size=4, max_context_len=32)
        self.max_total_num_tokens = 64
        self.token_to_kv_pool_allocator = Pool(size=self.max_total_num_tokens)
        self.forwards = 0

    def forward(self, forward_batch):
        self.forwards += 1
        if getattr(self, "fail_next_forward", False):
            raise RuntimeError("CUDA error: out of memory (fake)")
        output = self.model(forward_batch.input_ids, forward_batch.positions, forward_batch)
        return SimpleNamespace(logits_output=output)


class Req:
    def __init__(self, rid, origin_input_text, origin_input_ids, sampling_params):
        self.rid, self.origin_input_ids, self.sampling_params = rid, origin_input_ids, sampling_params
        self.prefix_indices = torch.empty(0, dtype=torch.int64)
        self.fill_ids = []
        self.extend_input_len = None

    def set_extend_input_len(self, n):
        self.extend_input_len = n


class ScheduleBatch:
    @classmethod
    def init_new(cls, *, reqs, req_to_token_pool, token_to_kv_pool_allocator, tree_cache, **kwargs):
        batch = cls()
        batch.reqs, batch.req_pool, batch.kv_pool = reqs, req_to_token_pool, token_to_kv_pool_allocator
        assert tree_cache.token_to_kv_pool_allocator is token_to_kv_pool_allocator
        return batch

    def prepare_for_extend(self):
        self.req_pool.alloc(len(self.reqs))
        for req in self.reqs:
            assert req.extend_input_len == len(req.fill_ids) > 0
            self.kv_pool.alloc(req.extend_input_len)

    def get_model_worker_batch(self):
        return SimpleNamespace(reqs=self.reqs)


class ForwardBatch:
    @classmethod
    def init_new(cls, model_worker_batch, model_runner):
        batch = cls()
        rows = [req.fill_ids for req in model_worker_batch.reqs]
        batch.input_ids = torch.tensor([t for row in rows for t in row])
        batch.positions = torch.cat([torch.arange(len(row)) for row in rows])
        batch.extend_seq_lens = torch.tensor([len(row) for row in rows])
        return batch


class Calls:
    def __init__(self):
        self.names: list[str] = []

    def recorder(self, name):
        return lambda *args, **kwargs: self.names.append(name)


def _module(name, **attrs):
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(attrs)
    return module


@pytest.fixture
def fake_sglang(monkeypatch):
    """Install the fake SGLang and pretend a CUDA GPU is present for one test."""
    calls = Calls()
    ModelRunner.created = []
    modules = {
        "sglang": {},
        "sglang.bench_one_batch": dict(TreeCacheNamespace=SimpleNamespace),
        "sglang.srt": {},
        "sglang.srt.configs": {},
        "sglang.srt.configs.model_config": dict(ModelConfig=ModelConfig),
        # the tensor-parallel ranks' all-gather; with one rank nothing calls it
        "sglang.srt.distributed": dict(tensor_model_parallel_all_gather=calls.recorder("all_gather")),
        "sglang.srt.distributed.parallel_state": dict(cleanup_dist_env_and_memory=calls.recorder("cleanup")),
        "sglang.srt.layers": {},
        "sglang.srt.layers.logits_processor": dict(
            LogitsMetadata=LogitsMetadata, LogitsProcessorOutput=LogitsProcessorOutput
        ),
        "sglang.srt.layers.moe": dict(initialize_moe_config=calls.recorder("moe_config")),
        "sglang.srt.layers.quantization": {},
        "sglang.srt.layers.quantization.fp4_utils": dict(
            initialize_fp4_gemm_config=calls.recorder("fp4_config")
        ),
        "sglang.srt.layers.quantization.fp8_utils": dict(
            initialize_fp8_gemm_config=calls.recorder("fp8_config")
        ),
        "sglang.srt.managers": {},
        "sglang.srt.managers.schedule_batch": dict(Req=Req, ScheduleBatch=ScheduleBatch),
        "sglang.srt.model_executor": {},
        "sglang.srt.model_executor.forward_batch_info": dict(ForwardBatch=ForwardBatch),
        "sglang.srt.model_executor.model_runner": dict(ModelRunner=ModelRunner),
        "sglang.srt.sampling": {},
        "sglang.srt.sampling.sampling_params": dict(SamplingParams=SimpleNamespace),
        "sglang.srt.server_args": dict(ServerArgs=ServerArgs),
        "sglang.srt.speculative": {},
        "sglang.srt.speculative.spec_info": dict(SpeculativeAlgorithm=SimpleNamespace(NONE="NONE")),
        "sglang.srt.utils": dict(get_free_port=lambda: 29555),
    }
    for name, attrs in modules.items():
        monkeypatch.setitem(sys.modules, name, _module(name, **attrs))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return SimpleNamespace(
        calls=calls,
        model_runners=ModelRunner.created,
        model_class=FakeCausalLM,
        vocab=VOCAB,
        hidden=HIDDEN,
        layers=LAYERS,
    )
