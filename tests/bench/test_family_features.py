"""bench/family_features.py at a tiny shape: it runs, and its bytes per token are a real reply's."""

import importlib.util
import json

import torch
from target_support import generate_body, serve, vocab_body

from eagle3_target.protocol.contract import FEATURES_HEADER
from eagle3_target.protocol.families import families
from eagle3_target.server.runners.synthetic import SyntheticRunner

from .bench_support import BENCH, run_bench

SCRIPT = BENCH / "family_features.py"


def bench_module():
    spec = importlib.util.spec_from_file_location("family_features", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_computed_reply_bytes_are_the_bytes_a_server_sends():
    bench = bench_module()
    shape = dict(num_hidden_layers=8, hidden_size=32, vocab_size=bench.DRAFT_VOCAB + 100)
    ids = torch.randint(0, shape["vocab_size"], (2, 7))
    async with serve(lambda: SyntheticRunner(**shape)) as srv:
        selected = torch.arange(bench.DRAFT_VOCAB)
        mask = torch.zeros(shape["vocab_size"], dtype=torch.bool)
        mask[selected] = True
        await srv.post("set_vocab_mapping", vocab_body(selected, mask))
        asks = bench.requests([1, 2, 3, 4, 5], 8)
        text = [f for f in families().values() if not bench.image_text(f)]  # a text-only target here
        assert len(asks) == len(text) + sum(f.compact is not None for f in text)  # each, and its compact one
        for label, features in asks.items():
            headers = {FEATURES_HEADER: features.to_header()}
            async with srv.http.post(f"{srv.url}/generate", data=generate_body(ids), headers=headers) as resp:
                assert resp.status == 200, label
                sent = len(await resp.read())
            assert sent == bench.reply_bytes(features, 2, 7, shape), label


def test_the_bench_runs_and_reports_every_family(tmp_path):
    out = tmp_path / "family.json"
    proc = run_bench("family_features.py", "--small", "--repeats", "1", "--json", str(out))
    result = json.loads(out.read_text())
    sizes = {k: v["bytes_per_token"] for k, v in result["bytes_per_token"].items()}
    assert 5 * 4096 * 2 < sizes["dflash"] < 5 * 4096 * 2 + 1  # five bf16 layers of Qwen3-8B, plus headers
    for family in ("peagle", "jetspec", "eagle1"):  # full-vocabulary logits dominate: 256-300 KB of them
        assert sizes[family] > 256 * 1024 and sizes[f"{family} compact"] < sizes[family] / 5
    assert result["compact_exactness"]["float32"]["identical"]
    for stage in ("vispec_stage1", "vispec"):  # Qwen2.5-VL-7B: the full-vocabulary logits dominate
        assert sizes[stage] > 152064 * 2 and sizes[f"{stage} compact"] < 16 * 1024
    # MiniMax M3 VL: five bf16 layers; the last id is the post-norm hidden state, sent once
    assert 5 * 6144 * 2 < sizes["dspark_vlm"] < 5 * 6144 * 2 + 1
    # measured through a text-only server: left out (DSpark-VLM's request is text DSpark's, measured)
    image_text = {"vispec", "vispec compact", "dspark_vlm"}
    assert set(result["through_one_server"]) == set(sizes) - image_text
    assert all(row["ratio"] > 0 for row in result["through_one_server"].values())
    assert "server/bare tokens/s" in proc.stdout
