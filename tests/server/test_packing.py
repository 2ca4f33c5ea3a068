"""Packed rows on the HF runner: several documents per row, each computed as if it were alone.

NeMo's bit-identity with its co-located packed run is tests/nemo/test_nemo_packing.py; here the meaning:
a packed row's supervision is, document by document, what that document gets unpacked, and the block-causal
mask is what makes it so. (RoPE scores depend on relative positions only, so per-document position_ids change
the last bits here, not the values: the NeMo test is the one that needs them.)
"""

import torch
from target_support import serve, vocab_body

from eagle3_target.protocol import wire
from eagle3_target.server.runners.hf import HFRunner
from eagle3_target.server.runners.synthetic import SyntheticRunner
from eagle3_target.server.runners.tiny import build_tiny_llama

V = 512
LENGTHS = (5, 7, 4)  # three documents in one row of 16, the last one with the row's padding folded in
S = 16


def body(input_ids, position_ids=None, seq_lens=None) -> bytes:
    ones = torch.ones_like(input_ids)
    packing = {} if seq_lens is None else {"position_ids": position_ids, "seq_lens": seq_lens}
    return wire.encode({"input_ids": input_ids, "attention_mask": ones, "loss_mask": ones, **packing})


async def supervise(srv, payload: bytes) -> dict[str, torch.Tensor]:
    async with srv.http.post(f"{srv.url}/generate", data=payload) as resp:
        assert resp.status == 200, await resp.text()
        return wire.decode(bytearray(await resp.read()))


def packed_row() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, V, (1, S), generator=torch.Generator().manual_seed(3))
    lengths = [*LENGTHS[:-1], S - sum(LENGTHS[:-1])]
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    return ids, positions, torch.tensor([lengths + [0]])  # a 0-length entry, as NeMo's collate pads


async def test_a_packed_row_is_its_documents_computed_alone():
    async with serve(lambda: HFRunner(build_tiny_llama(seed=2), name="tiny")) as srv:
        async with srv.http.post(f"{srv.url}/model_info") as resp:
            assert "packing" in (await resp.json())["features"]
        await srv.post("set_vocab_mapping", vocab_body(torch.arange(V), torch.ones(V, dtype=torch.bool)))
        ids, positions, seq_lens = packed_row()
        packed = await supervise(srv, body(ids, positions, seq_lens))
        whole = await supervise(srv, body(ids))
        start = 0
        for n in seq_lens[0].tolist()[:-1]:
            alone = await supervise(srv, body(ids[:, start : start + n]))
            # the last position of a document is shifted against the next document's first token: skip it
            for key in ("aux_hidden_states", "target_probs"):
                got, want = packed[key][0, start : start + n - 1], alone[key][0, : n - 1]
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            start += n
        # the mask matters: past the first document a packed row is not the unpacked row
        later = slice(LENGTHS[0], S)
        assert not torch.allclose(packed["aux_hidden_states"][0, later], whole["aux_hidden_states"][0, later])


async def test_a_runner_without_packing_says_so_and_refuses_packed_rows():
    async with serve(lambda: SyntheticRunner(vocab_size=V)) as srv:
        async with srv.http.post(f"{srv.url}/model_info") as resp:
            assert "packing" not in (await resp.json()).get("features", [])
        await srv.post("set_vocab_mapping", vocab_body(torch.arange(8), torch.ones(V, dtype=torch.bool)))
        ids, positions, seq_lens = packed_row()
        async with srv.http.post(f"{srv.url}/generate", data=body(ids, positions, seq_lens)) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"] == "packing_not_offered"
        assert (await supervise(srv, body(ids)))["target_probs"].shape == (1, S, 8)
