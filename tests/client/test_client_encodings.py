"""Supervision encodings end to end over the wire: exactness against "nemo", negotiation, incomplete replies."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from aiohttp import web
from target_support import served

from eagle3_target.client import EncodingError, PoolOptions, RemoteTargetBackend
from eagle3_target.protocol import contract, wire
from eagle3_target.server.app import TargetServer
from eagle3_target.server.runners.hf import HFRunner
from eagle3_target.server.runners.synthetic import SyntheticRunner

from .client_support import assert_batch_matches, draft_vocab, expected, make_batch

pytestmark = pytest.mark.timeout(120)

FAST = PoolOptions(deadline=10.0, start_timeout=10.0, backoff_base=0.01, backoff_max=0.2)
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-3}


def fetch(url: str, encoding: str, batches) -> tuple[dict[str, str], list[dict[str, torch.Tensor]]]:
    vocab = draft_vocab()
    with RemoteTargetBackend(url, options=FAST, encoding=encoding) as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        return backend.encodings, [backend.generate_batch(*b).as_dict() for b in batches]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_encoding_against_nemo_on_the_hf_runner(farm, dtype):
    url = farm.start("127.0.0.2", loader=lambda: HFRunner.load(dtype=dtype))
    batches = [make_batch(seed, batch=2, seq=24) for seed in range(3)]
    _, nemo = fetch(url, "nemo", batches)
    for encoding in ("auto", "logits", "hidden"):
        used, got = fetch(url, encoding, batches)
        assert used == {url: "logits" if encoding == "auto" else encoding}
        for have, want in zip(got, nemo, strict=True):
            for key, value in want.items():
                assert have[key].dtype == value.dtype and have[key].shape == value.shape, key
                if encoding == "hidden" and key == "target_probs":
                    assert (have[key] - value).abs().max() <= TOLERANCE[getattr(torch, dtype)]
                else:
                    assert torch.equal(have[key], value), (encoding, key)


class OldServer(TargetServer):
    """A server from before encodings: /model_info has no "encodings"."""

    async def model_info(self, request: web.Request) -> web.Response:
        info = json.loads((await super().model_info(request)).body)
        del info["encodings"]
        return web.json_response(info)


def test_a_server_without_encodings_gets_nemo_and_refuses_anything_else(farm):
    url = farm.start("127.0.0.2", server_type=OldServer, dtype="float32")
    runner, vocab, batch = SyntheticRunner(dtype="float32"), draft_vocab(), make_batch(4)
    used, got = fetch(url, "auto", [batch])
    assert used == {url: "nemo"}
    for key, value in expected(runner, vocab, *batch).items():
        assert torch.equal(got[0][key], value), key
    with pytest.raises(EncodingError, match=f"{url} does not offer encoding 'logits' \\(it offers nemo\\)"):
        RemoteTargetBackend(url, options=FAST, encoding="logits")


def test_a_joining_server_that_lacks_the_encoding_is_refused_and_the_pool_goes_on(farm):
    good = farm.start("127.0.0.2", dtype="float32")
    old = farm.start("127.0.0.3", server_type=OldServer, dtype="float32")
    with RemoteTargetBackend([good, old], options=dataclasses.replace(FAST, encoding="hidden")) as backend:
        backend.wait_for_servers(10)
        assert backend.encodings == {good: "hidden"}
        assert f"{old} refused" in backend.pool.describe_members()
        assert "does not offer encoding 'hidden'" in backend.pool.describe_members()


def test_an_unknown_encoding_is_refused_before_any_network_work():
    with pytest.raises(ValueError, match="unknown encoding 'zstd'; choose auto, nemo, logits, hidden"):
        RemoteTargetBackend("http://127.0.0.2:9", encoding="zstd")


class TruncatingServer(TargetServer):
    """Answers /generate 200 with a reply that lacks its logits: a broken or hostile peer."""

    async def stream_blob(self, request, blob, headers=None):
        if request.path == "/" + contract.GENERATE:
            tensors = wire.decode(bytearray(blob.tobytes()))
            tensors.pop("draft_logits", None)
            blob = wire.EncodedBlob(tensors)
        return await super().stream_blob(request, blob, headers)


def test_an_incomplete_reply_fails_over_to_another_server(farm, caplog):
    broken = farm.start("127.0.0.2", server_type=TruncatingServer, dtype="float32")
    good = farm.start("127.0.0.3", dtype="float32")
    runner, vocab = SyntheticRunner(dtype="float32"), draft_vocab()
    with RemoteTargetBackend([broken, good], options=FAST) as backend:
        backend.wait_for_servers(10)
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        for seed in range(4):
            batch = make_batch(seed)
            assert_batch_matches(backend.generate_batch(*batch), expected(runner, vocab, *batch), batch[1])
        assert backend.pool.failovers >= 1
    assert "reply lacks 'draft_logits'" in caplog.text  # why the broken server was quarantined


def test_hidden_fetches_the_lm_head_rows_once_per_mapping(farm):
    url = farm.start("127.0.0.2", dtype="float32")
    server = farm.server(url)
    runner = SyntheticRunner(dtype="float32")
    with RemoteTargetBackend(url, options=FAST, encoding="hidden") as backend:
        for size, seeds in ((96, range(3)), (40, range(3, 5))):
            vocab = draft_vocab(size=size)
            backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
            for seed in seeds:
                batch = make_batch(seed)
                got, want = backend.generate_batch(*batch), expected(runner, vocab, *batch)
                assert got.target_probs.shape == want["target_probs"].shape
                assert (got.target_probs - want["target_probs"]).abs().max() <= 1e-5
                assert torch.equal(got.position_mask, want["position_mask"])
            assert served(server, "lm_head", "200") == (1 if size == 96 else 2)
