"""bfloat16, the vllm engine against the hf engine: a module of its own, since one vllm engine runs per process
(test_vllm_engine.py's float32 engine lives as long as its module)."""

from eagle3_target.server.runners import load_runner

from .vllm_support import AUX_LAYER_IDS, BATCHES, supervision


def test_bfloat16_agreement_is_reported(vllm_model_dir, record_property, capsys):
    """bf16 kernels differ between engines, so this reports the gap, and bounds it loosely."""
    options = dict(model=vllm_model_dir, dtype="bfloat16", device="cpu", aux_layer_ids=AUX_LAYER_IDS)
    vllm_bf16, hf_bf16 = load_runner("vllm", **options), load_runner("hf", **options)
    try:
        (input_ids, attention_mask, loss_mask), vocab = BATCHES["padding and loss masks"]
        got = supervision(vllm_bf16, input_ids, attention_mask, loss_mask, vocab)
        want = supervision(hf_bf16, input_ids, attention_mask, loss_mask, vocab)
    finally:
        vllm_bf16.close()
    real = attention_mask.bool()
    aux_gap = (got["aux_hidden_states"] - want["aux_hidden_states"]).float().abs()[real].max().item()
    aux_scale = want["aux_hidden_states"].float().abs()[real].max().item()
    probs_gap = (got["target_probs"] - want["target_probs"]).abs().max().item()
    same_mask = (got["position_mask"] == want["position_mask"]).float().mean().item()
    report = (
        f"bfloat16 vllm vs hf: aux max abs diff {aux_gap:.3g} (max |aux| {aux_scale:.3g}), "
        f"target_probs max abs diff {probs_gap:.3g}, position_mask agreement {same_mask:.1%}"
    )
    record_property("bfloat16_agreement", report)
    with capsys.disabled():
        print(f"\n{report}")
    assert aux_gap <= 0.05 * aux_scale and probs_gap < 0.05 and same_mask >= 0.9
