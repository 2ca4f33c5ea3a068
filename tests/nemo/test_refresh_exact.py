"""A target that changes mid-run, exactly: NeMo's EAGLE-3 training of 16 steps against two fleet servers whose
target is refreshed in place from weights A to weights B after step 8 trains bit for bit as NeMo's co-located
recipe whose target model is swapped from A to B at the same step (the swap is this test's, not the product's).
The trainer pins the new version once the fleet serves it, so the batches prefetched from A are asked again."""

from __future__ import annotations

import json
import shutil
import urllib.request

import pytest
import torch
from nemo_automodel.components.speculative.eagle import HFEagle3TargetModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from eagle3_target.client.nemo import NeMoTargetBackend

from .eagle3_loop import assert_identical, nemo_batches, train
from .exactness import start_fleet
from .nemo_support import build_target, write_chats

ADMIN = "fleet-admin-token"
SWAP_AFTER = 7  # the index of step 8: steps 9 to 16 train against B
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """Weights A (the tiny target) and B (A moved by a seeded perturbation: one model, another checkpoint),
    and 32 conversations: 16 batches of 2."""
    root = tmp_path_factory.mktemp("refresh-exact")
    a = build_target(root / "a")
    b = root / "b"
    shutil.copytree(a, b)
    tensors = load_file(b / "model.safetensors")
    generator = torch.Generator().manual_seed(11)
    moved = {
        k: v + 0.05 * torch.randn(v.shape, generator=generator, dtype=v.dtype) for k, v in tensors.items()
    }
    save_file(moved, b / "model.safetensors", metadata={"format": "pt"})
    return a, b, write_chats(root / "chats.jsonl", 32)


def refresh(url: str, source, version: str) -> None:
    body = json.dumps({"source": str(source), "version": version}).encode()
    headers = {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"}
    with OPENER.open(urllib.request.Request(f"{url}/weights/refresh", body, headers), timeout=120) as reply:
        assert json.load(reply) == {"version": version}


def colocated(a, b, data, swap: bool):
    """NeMo's co-located target, its model's weights replaced by B's after step SWAP_AFTER when ``swap``."""
    model = AutoModelForCausalLM.from_pretrained(a)
    weights_b = AutoModelForCausalLM.from_pretrained(b).state_dict()

    def swap_to_b(step: int) -> None:
        if swap and step == SWAP_AFTER:
            model.load_state_dict(weights_b)

    return train(HFEagle3TargetModel(model), data, a, prefetch=False, after_step=swap_to_b)


def test_a_refresh_after_step_8_trains_as_the_colocated_recipe_swapped_at_step_8(targets, tmp_path):
    a, b, chats = targets
    data = nemo_batches(a, chats)
    assert len(data[0]) == 16
    reference = colocated(a, b, data, swap=True)
    unswapped = colocated(a, b, data, swap=False)
    assert not torch.equal(reference[0][SWAP_AFTER + 1 :], unswapped[0][SWAP_AFTER + 1 :]), "B must matter"
    token = tmp_path / "admin-token"
    token.write_text(ADMIN + "\n")
    servers = start_fleet(a, ["127.0.0.2", "127.0.0.3"], "--admin-token-file", str(token))
    try:
        with NeMoTargetBackend([s.url for s in servers]) as backend:
            backend.wait_for_servers()
            started = backend.target_version
            assert started.startswith("sha256-")

            def refresh_after_step_8(step: int) -> None:
                if step == SWAP_AFTER:
                    for server in servers:
                        refresh(server.url, b, "policy-b")
                    backend.pin_target_version("policy-b")

            got = train(backend, data, a, prefetch=True, after_step=refresh_after_step_8)
            assert backend.target_version == "policy-b"
    finally:
        for server in servers:
            server.kill()
    assert_identical(got, reference)
