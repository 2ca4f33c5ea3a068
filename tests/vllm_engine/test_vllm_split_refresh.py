"""POST /weights/refresh on a vllm replica split over tensor parallel 2 (the mp executor's worker processes on
this CPU): vLLM's own reload on both ranks, each taking its shard, serves the new weights as the one-device hf
engine computes them within 1e-4; back again bit for bit as before; a source of other shapes is refused before
anything that serves changes."""

import time

import pytest
import torch
from parallel_support import TOLERANCE, write_split_llama
from target_support import serve, vocab_body

from eagle3_target.protocol.supervision import build_supervision
from eagle3_target.server.options import ServerOptions
from eagle3_target.server.parallel import ParallelLayout
from eagle3_target.server.runners import load_runner

from .split_support import AUX_LAYER_IDS, NODE_ENV, batch, gaps
from .vllm_support import ADMIN, refresh, served

pytestmark = pytest.mark.timeout(1200)  # the engine starts in 25-70 s on 2 idle cores, minutes when loaded

IDS, MASK, LOSS, VOCAB = batch()


def assert_equal(got: dict, want: dict) -> None:
    assert list(got) == list(want) and all(torch.equal(got[k], v) for k, v in want.items())


async def test_tensor_parallel_2_refreshes_in_place_as_the_hf_engine_computes_the_new_weights(
    order_one_dir, tmp_path, monkeypatch
):
    for key, value in NODE_ENV.items():
        monkeypatch.setenv(key, value)
    weights_b = write_split_llama(tmp_path / "b", seed=7)
    other = write_split_llama(tmp_path / "other-shapes", intermediate_size=96)
    options = dict(model=order_one_dir, dtype="float32", device="cpu", aux_layer_ids=AUX_LAYER_IDS)
    split = ParallelLayout(tensor_parallel_size=2)
    loader = lambda: load_runner("vllm", parallel=split, **options)  # noqa: E731
    async with serve(loader, ServerOptions(admin_token=ADMIN), wait=False) as srv:
        await srv.wait_ready(timeout=900)
        mapping = vocab_body(VOCAB.selected_token_ids, VOCAB.selected_token_mask)
        assert (await srv.post("set_vocab_mapping", mapping)).status == 200
        started, before = await served(srv, IDS, MASK, LOSS)
        status, refused = await refresh(srv, other, "v-other")
        assert status == 400 and refused["error"] == "source_mismatch", refused
        version, kept = await served(srv, IDS, MASK, LOSS)
        assert version == started
        assert_equal(kept, before)
        start = time.perf_counter()
        assert await refresh(srv, weights_b, "v-b") == (200, {"version": "v-b"})
        print(f"refreshed to B in {time.perf_counter() - start:.2f}s")
        version, after = await served(srv, IDS, MASK, LOSS)
        assert version == "v-b"
        assert await refresh(srv, order_one_dir, "v-a") == (200, {"version": "v-a"})
        version, again = await served(srv, IDS, MASK, LOSS)
        assert version == "v-a"
        assert_equal(again, before)
    hf = load_runner("hf", **{**options, "model": str(weights_b)})
    want = build_supervision(*hf.forward(IDS, MASK), IDS, LOSS, VOCAB)
    largest = gaps(after, want)
    print("largest gaps to the hf engine on B", largest)
    assert max(largest.values()) <= TOLERANCE, largest
    real = MASK.bool()
    assert not torch.allclose(after["aux_hidden_states"][real], before["aux_hidden_states"][real], atol=1e-2)
