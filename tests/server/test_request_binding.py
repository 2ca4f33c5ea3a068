"""/generate binds its reply to the request for a client that asks (X-Eagle3-Request), and adds nothing
for one that does not (every stock NeMo client)."""

from __future__ import annotations

import hashlib

import pytest
import torch
from target_support import generate_body, serve, vocab_body

from eagle3_target.protocol import contract
from eagle3_target.protocol.binding import check_echo, check_finite, check_inputs_echo
from eagle3_target.protocol.wire import WireError
from eagle3_target.server.runners.synthetic import SyntheticRunner

V = 512
IDS = torch.randperm(V, generator=torch.Generator().manual_seed(0))[:64]


@pytest.mark.parametrize(
    "request_id, echoed",
    [(None, False), ("0123abcd-ef_XY", True), ("x" * 65, False), ("bad id\u00e9", False)],
    ids=["a stock client", "our client", "an id too long", "an id out of the alphabet"],
)
async def test_the_reply_echoes_a_well_formed_request_id_with_the_body_digest(request_id, echoed):
    mask = torch.zeros(V, dtype=torch.bool)
    mask[IDS] = True
    body = generate_body(torch.arange(12).view(2, 6))
    headers = (
        {} if request_id is None else {contract.REQUEST_ID_HEADER: request_id.encode().decode("latin-1")}
    )
    async with serve(lambda: SyntheticRunner(vocab_size=V)) as srv:
        await srv.post(contract.SET_VOCAB_MAPPING, vocab_body(IDS, mask))
        reply = await srv.post(contract.GENERATE, body, headers=headers)
        async with srv.http.post(f"{srv.url}/{contract.MODEL_INFO}") as response:
            info = await response.json()
    assert reply.status == 200
    if echoed:
        assert reply.headers[contract.REQUEST_ID_HEADER] == request_id
        assert reply.headers[contract.REQUEST_DIGEST_HEADER] == "sha256:" + hashlib.sha256(body).hexdigest()
    else:
        assert contract.REQUEST_ID_HEADER not in reply.headers
        assert contract.REQUEST_DIGEST_HEADER not in reply.headers
    assert info["request_binding"] == "sha256"


def refusal(check, *args) -> str:
    with pytest.raises(WireError) as error:
        check(*args)
    return str(error.value)


def test_the_clients_checks_name_what_is_wrong():
    """The words a refused reply is logged with: the id or digest received, cut at 80 characters."""
    ours = {contract.REQUEST_ID_HEADER: "req-1", contract.REQUEST_DIGEST_HEADER: "d" * 64}
    check_echo(ours, "req-1", "d" * 64)
    other = {**ours, contract.REQUEST_ID_HEADER: "x" * 81}
    assert (
        refusal(check_echo, other, "req-1", "d" * 64)
        == f"the reply answers request {'x' * 80!r}, not 'req-1'"
    )
    other = {**ours, contract.REQUEST_DIGEST_HEADER: "e" * 81}
    assert refusal(check_echo, other, "req-1", "d" * 64) == (
        f"the reply was computed on another request body (digest {'e' * 80!r})"
    )
    ids, loss = torch.tensor([[1, 2, 3]]), torch.tensor([[0, 1, 1]])
    reply = {"input_ids": torch.tensor([[2, 3, 0]]), "loss_mask": torch.tensor([[1, 1, 0]])}
    check_inputs_echo(reply, ids, loss)
    words = refusal(check_inputs_echo, {**reply, "loss_mask": torch.tensor([[1, 0, 0]])}, ids, loss)
    assert words == "the reply's loss_mask are not this request's: a reply to another batch"
    check_finite({"logits": torch.ones(2), "input_ids": ids})
    words = refusal(check_finite, {"logits": torch.tensor([1.0, float("nan")])})
    assert words == "the reply's 'logits' holds NaN or infinite values"
