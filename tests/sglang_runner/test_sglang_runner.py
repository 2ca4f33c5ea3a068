"""The SGLang runner's contract, run through its real code against the fake SGLang in conftest.py."""

import re
import sys

import pytest
import torch

from eagle3_target.protocol.supervision import VocabMapping, build_supervision
from eagle3_target.server import errors
from eagle3_target.server.runners import load_runner
from eagle3_target.server.runners.base import Capture, ForwardInputs
from eagle3_target.server.runners.sglang import SGLangUnavailable
from eagle3_target.server.runners.sglang_setup import sglang_dtype


def load(**options):
    options = {
        "model": "org/fake-model",
        "dtype": "float32",
        "device": "cuda:0",
        "aux_layer_ids": None,
        **options,
    }
    return load_runner("sglang", **options)


def right_padded(lengths, seq, seed=0, vocab=50):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (len(lengths), seq), generator=gen)
    mask = (torch.arange(seq) < torch.tensor(lengths)[:, None]).long()
    return ids * mask, mask


def alone(runner, row):
    """The row forwarded by itself, unpadded: what its slice of any batch must equal."""
    ids = row[None]
    return runner.forward(ids, torch.ones_like(ids))


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [(torch.bfloat16, "bfloat16"), (torch.float16, "float16"), (torch.float32, "float32")],
)
def test_torch_dtype_maps_to_the_server_args_string(dtype, expected):
    assert sglang_dtype(dtype) == expected


def test_unsupported_dtype_is_refused():
    with pytest.raises(ValueError, match="no dtype torch.float64"):
        sglang_dtype(torch.float64)


def test_load_builds_one_single_process_model_runner(fake_sglang):
    runner = load(dtype="auto", device="cuda:1")
    (created,) = fake_sglang.model_runners
    args = created["server_args"]
    assert (args.model_path, args.dtype, args.device, args.base_gpu_id, args.tp_size) == (
        "org/fake-model",
        "bfloat16",
        "cuda",
        1,
        1,
    )
    assert args.disable_cuda_graph and args.disable_radix_cache and args.skip_tokenizer_init
    assert (created["gpu_id"], created["tp_rank"], created["tp_size"], created["pp_size"]) == (1, 0, 1, 1)
    assert created["nccl_port"] == 29555 and created["mem_fraction_static"] == args.mem_fraction_static == 0.5
    assert sorted(fake_sglang.calls.names) == ["fp4_config", "fp8_config", "moe_config"]
    assert runner.info.dtype == torch.bfloat16


def test_model_info_describes_the_sglang_target(fake_sglang):
    info = load().info.model_info().to_json()
    assert info["engine"] == "sglang" and info["model"] == "org/fake-model"
    shape = (info["num_hidden_layers"], info["hidden_size"], info["vocab_size"])
    assert shape == (fake_sglang.layers, fake_sglang.hidden, fake_sglang.vocab)
    assert info["aux_layer_ids"] == [1, fake_sglang.layers // 2 - 1, fake_sglang.layers - 4]
    assert info["dtype"] == "float32"
    runner = load()
    assert "_name_or_path" not in runner.info.config and runner.info.config["model_type"] == "fake"


@pytest.mark.parametrize("lengths", [[5, 3, 7, 1], [7, 7]])
def test_rows_come_back_stacked_with_zeros_past_their_length(fake_sglang, lengths):
    runner = load()
    seq = max(lengths)
    ids, mask = right_padded(lengths, seq)
    logits, aux = runner.forward(ids, mask)
    assert logits.shape == (len(lengths), seq, fake_sglang.vocab)
    assert aux.shape == (len(lengths), seq, 3 * fake_sglang.hidden)
    for b, n in enumerate(lengths):
        row_logits, row_aux = alone(runner, ids[b, :n])
        torch.testing.assert_close(logits[b, :n], row_logits[0])
        torch.testing.assert_close(aux[b, :n], row_aux[0])
        assert not logits[b, n:].any() and not aux[b, n:].any()


def test_aux_states_are_the_requested_layer_outputs_in_the_requested_order(fake_sglang):
    ids = [4, 0, 1]  # unsorted on purpose: SGLang captures in layer order
    runner = load(aux_layer_ids=ids)
    input_ids, mask = right_padded([6, 6], 6)
    _, aux = runner.forward(input_ids, mask)
    outputs = runner.model_runner.model.layer_outputs
    expected = torch.cat([outputs[i] for i in ids], dim=-1).view(2, 6, 3 * fake_sglang.hidden)
    torch.testing.assert_close(aux, expected)


def test_supervision_at_a_position_is_the_next_tokens_prediction(fake_sglang):
    """Logits are returned unshifted; after the shared shift, position t holds the distribution for t + 1."""
    runner = load()
    lengths = [6, 4]
    ids, mask = right_padded(lengths, 6, seed=3)
    logits, aux = runner.forward(ids, mask)
    out = build_supervision(logits, aux, ids, mask, VocabMapping.identity(fake_sglang.vocab))
    for b, n in enumerate(lengths):
        for t in range(n - 1):
            prefix_logits, _ = alone(runner, ids[b, : t + 2])  # causal: the prefix through t + 1 decides it
            torch.testing.assert_close(
                out["target_probs"][b, t], torch.softmax(prefix_logits[0, -1].float(), -1)
            )
        assert out["loss_mask"][b, n - 1 :].sum() == 0


def test_each_forward_starts_from_an_empty_cache(fake_sglang):
    runner = load()
    ids, mask = right_padded([8, 8, 8, 8], 8)  # 32 tokens: two of these would overflow the 64-slot pool
    for _ in range(3):
        runner.forward(ids, mask)
    pool = runner.model_runner.token_to_kv_pool_allocator
    assert pool.used == 0 and pool.clears == runner.model_runner.forwards == 3


def test_a_failed_forward_still_frees_the_cache(fake_sglang):
    runner = load()
    ids, mask = right_padded([8, 8], 8)
    runner.model_runner.fail_next_forward = True
    with pytest.raises(RuntimeError, match="out of memory"):
        runner.forward(ids, mask)
    runner.model_runner.fail_next_forward = False
    assert runner.model_runner.token_to_kv_pool_allocator.used == 0
    assert runner.forward(ids, mask)[0].shape == (2, 8, fake_sglang.vocab)


def test_empty_rows_are_zeros_and_an_empty_batch_runs_nothing(fake_sglang):
    runner = load()
    ids, mask = right_padded([0, 3], 4)
    logits, aux = runner.forward(ids, mask)
    assert not logits[0].any() and not aux[0].any() and logits[1, :3].any()
    logits, aux = runner.forward(*right_padded([0, 0], 4))
    assert logits.shape == (2, 4, fake_sglang.vocab) and aux.shape == (2, 4, 3 * fake_sglang.hidden)
    assert logits.dtype == aux.dtype == torch.float32
    assert not logits.any() and runner.model_runner.forwards == 1


def test_left_padding_is_a_client_error(fake_sglang):
    runner = load()
    ids = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(errors.InvalidInput) as err:
        runner.forward(ids, torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]]))
    assert "right-padded" in err.value.detail
    assert runner.model_runner.forwards == 0


@pytest.mark.parametrize(
    ("lengths", "what"),
    [
        ([1] * 5, "rows: 5 is over this server's limit of 4"),
        ([33], "longest row: 33 is over this server's limit of 32"),
        ([20, 20, 20, 20], "in all: 80 is over this server's limit of 64"),
    ],
)
def test_a_batch_over_sglang_capacity_is_refused_before_allocating(fake_sglang, lengths, what):
    runner = load()
    with pytest.raises(errors.TooLarge) as err:
        runner.forward(*right_padded(lengths, max(lengths)))
    assert what in err.value.detail
    assert runner.model_runner.forwards == 0 and runner.model_runner.token_to_kv_pool_allocator.used == 0


def test_input_embeddings_drop_sglang_vocab_padding(fake_sglang):
    runner = load()
    weight = runner.input_embeddings()
    assert weight.shape == (fake_sglang.vocab, fake_sglang.hidden)
    assert torch.equal(weight, runner.model_runner.model.embed_tokens.weight[: fake_sglang.vocab])


def test_close_releases_the_model_and_sglang_distributed_state(fake_sglang):
    runner = load()
    runner.close()
    assert runner.model_runner is None and fake_sglang.calls.names[-1] == "cleanup"


def test_the_last_layer_cannot_be_an_aux_layer(fake_sglang):
    with pytest.raises(ValueError, match=f"cannot capture the last layer \\({fake_sglang.layers - 1}\\)"):
        load(aux_layer_ids=[0, 1, fake_sglang.layers - 1])


def test_a_model_sglang_cannot_capture_is_refused(fake_sglang, monkeypatch):
    monkeypatch.delattr(fake_sglang.model_class, "set_eagle3_layers_to_capture")
    with pytest.raises(ValueError, match="cannot capture EAGLE-3 aux hidden states; use --engine hf"):
        load()


def test_without_sglang_the_error_says_how_to_install_it(fake_sglang, monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", None)
    with pytest.raises(
        SGLangUnavailable, match=r"pip install 'eagle3-target\[sglang\]' in a separate server image"
    ):
        load()
    assert fake_sglang.model_runners == []


def test_without_a_gpu_the_error_says_so_before_any_work(fake_sglang, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SGLangUnavailable, match="needs a CUDA GPU") as err:
        load()
    assert "pip install" not in str(err.value) and fake_sglang.model_runners == []


def test_a_cpu_device_is_refused_with_the_flag_to_use(fake_sglang):
    with pytest.raises(SGLangUnavailable, match="pass --device cuda or cuda:N, not 'cpu'"):
        load(device="cpu")


def test_a_model_is_required(fake_sglang):
    with pytest.raises(ValueError, match="needs --model"):
        load(model=None)


def test_a_capture_gives_aux_layers_in_any_order_and_refuses_what_sglang_cannot_give(fake_sglang):
    runner = load(aux_layer_ids=[4, 0, 1])
    input_ids, mask = right_padded([6, 4], 6)
    logits, aux = runner.forward(input_ids, mask)
    by_layer = dict(zip([4, 0, 1], aux.split(fake_sglang.hidden, dim=-1), strict=True))
    got = runner.capture(ForwardInputs(input_ids, mask), Capture(layers=(1, 4), logits=True))
    assert torch.equal(got.hidden_states, torch.cat([by_layer[1], by_layer[4]], -1))
    assert torch.equal(got.logits, logits) and got.final_hidden is None
    refusals = {
        Capture(layers=(2,)): "not layers [2]",
        Capture(layers=(-1,)): "not layers [-1]",
        Capture(layers=(1,), final_hidden=True): "not the final hidden state",
    }
    for want, detail in refusals.items():
        with pytest.raises(errors.InvalidInput, match=re.escape(detail)) as err:
            runner.capture(ForwardInputs(input_ids, mask), want)
        assert err.value.error == "feature_not_offered"
    with pytest.raises(errors.InvalidInput, match="cannot run packed sequences"):
        runner.capture(ForwardInputs(input_ids, mask, position_ids=mask), Capture(layers=(1,)))
    assert runner.info.model_info().features == ("layers", "logits", "draft_probs")
