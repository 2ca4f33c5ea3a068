"""Shared by the vllm engine's split-replica tests: the batch, what a trainer asks of a target, and how
close the replies are to one device's. The model is parallel_support.write_split_llama's: values of order 1, head_dim 32, 2 KV heads."""

import torch

from eagle3_target.protocol.encodings import NEMO, encode
from eagle3_target.protocol.families import dflash
from eagle3_target.protocol.features import WEIGHT_LM_HEAD
from eagle3_target.protocol.supervision import VocabMapping, shift_left
from eagle3_target.server.runners.base import Capture, ForwardInputs

AUX_LAYER_IDS = [1, 3, 7]
DFLASH_LAYERS = [-1, 1, 4, 6]  # the embedding output too: on the first pipeline stage only
VOCAB = 512
# vLLM binds each rank's OpenMP threads to cores by default; on a shared CI machine, let the OS place them.
NODE_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1"}


def batch():
    """Four right-padded rows (one of a single token), loss masked on a prefix, and a draft vocabulary."""
    gen = torch.Generator().manual_seed(2)
    lengths = torch.tensor([40, 17, 1, 33])
    attention_mask = (torch.arange(40) < lengths[:, None]).long()
    input_ids = torch.randint(0, VOCAB, (4, 40), generator=gen) * attention_mask
    loss_mask = attention_mask.clone()
    loss_mask[:, :10] = 0
    ids = torch.randperm(VOCAB, generator=gen)[:96]
    mask = torch.zeros(VOCAB, dtype=torch.bool)
    mask[ids] = True
    return input_ids, attention_mask, loss_mask, VocabMapping(ids, mask)


def replies(runner) -> dict[str, torch.Tensor]:
    """What a trainer gets: EAGLE-3's nemo encoding, a DFlash feature request, /weights/lm_head."""
    input_ids, attention_mask, loss_mask, vocab = batch()
    logits, aux = runner.forward(input_ids, attention_mask)
    out = {f"nemo/{k}": v for k, v in encode(NEMO, logits, aux, input_ids, loss_mask, vocab).items()}
    want = Capture.of(dflash.FAMILY.ask(DFLASH_LAYERS, runner.info.num_hidden_layers))
    out["dflash/hidden_states"] = runner.capture(ForwardInputs(input_ids, attention_mask), want).hidden_states
    out["weights/lm_head"] = runner.weight(WEIGHT_LM_HEAD)
    return out


def gaps(got: dict, want: dict) -> dict[str, float]:
    """Largest absolute difference per reply, where the one-device hf engine's numbers mean something:
    at real tokens (hidden states) and where the next token is real (target_probs); the masks and ids
    must be equal. vLLM leaves padding zero, the hf engine computes over it."""
    _, attention_mask, _, _ = batch()
    real, next_real = attention_mask.bool(), shift_left(attention_mask).bool()
    assert list(got) == list(want)
    out = {}
    for key, a in got.items():
        b = want[key]
        assert a.shape == b.shape and a.dtype == b.dtype, key
        if key.endswith(("position_mask", "input_ids", "loss_mask")):
            assert torch.equal(a, b), key
            continue
        where = next_real if key.endswith("target_probs") else real if a.dim() == 3 else slice(None)
        out[key] = float((a[where] - b[where]).abs().max())
    return out


def alive(pid: int) -> bool:
    """Whether a process lives (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def children(pid: int) -> list[int]:
    """Every process below pid (vLLM's worker processes and their helpers)."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
