"""Feature requests on the server: the X-Eagle3-Features header checked against the runner, and one
capture turned into the reply (protocol/capture.py). No HTTP here, as in the service."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from eagle3_target.protocol import capture as reply
from eagle3_target.protocol.choices import NEMO
from eagle3_target.protocol.contract import IMAGE_KEYS
from eagle3_target.protocol.features import KEY_IMAGE_MASK, FeatureError, Features
from eagle3_target.protocol.supervision import VocabMapping

from .errors import InvalidInput, OutOfRange
from .runners import RunnerInfo, TargetRunner
from .runners.base import Capture, ForwardInputs

FORWARD_KEYS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "seq_lens",
    *IMAGE_KEYS,
)  # ForwardInputs' fields


def requested(info: RunnerInfo, header: str | None, encoding: str, p2p: bool) -> Features | None:
    """The request's features, checked against the runner before any work; None: EAGLE-3's encodings."""
    if header is None:
        return None
    if encoding != NEMO:
        raise InvalidInput("features_with_encoding", "a feature request takes no encoding header")
    if p2p:
        raise InvalidInput("features_over_p2p", "feature replies go over the wire only")
    try:
        features = Features.from_header(header)
        features.check(info.num_hidden_layers, info.features, f"this server ({info.engine})")
    except FeatureError as exc:
        raise (OutOfRange if exc.error == "layer_out_of_range" else InvalidInput)(
            exc.error, exc.detail
        ) from None
    return features


def capture(
    runner: TargetRunner,
    inputs: dict[str, torch.Tensor],
    features: Features,
    vocab: VocabMapping | None,
    timings: dict[str, float],
) -> Callable[[], dict[str, torch.Tensor]]:
    """On the model thread: one capture of what ``features`` ask; returns the reply's assembly on the device
    (its "projection" phase), which the service runs after the turn, beside the next forward."""
    device = runner.info.device
    start = time.perf_counter()
    forward = ForwardInputs(**{k: inputs[k].to(device) for k in FORWARD_KEYS if inputs.get(k) is not None})
    got = runner.capture(forward, Capture.of(features))
    loss_mask = inputs["loss_mask"].to(device)  # queued before the assembly, on the compute stream
    cuda = torch.device(device).type == "cuda"
    if cuda:  # the forward's time, not the next phase's (every stream: an engine may compute on its own)
        torch.cuda.synchronize(device)
    timings["forward"] = time.perf_counter() - start

    def assemble() -> dict[str, torch.Tensor]:
        start = time.perf_counter()
        out = reply.reply(
            features, got.hidden_states, got.final_hidden, got.logits, forward.input_ids, loss_mask, vocab
        )
        if features.image_mask:  # requested() admits it only from a runner with an image spec
            token_id = runner.info.image_spec.token_id
            out[KEY_IMAGE_MASK] = reply.image_mask(forward.input_ids, token_id, features)
        if cuda:  # on the stream it ran on (the copy's side stream after the turn)
            torch.cuda.current_stream(device).synchronize()
        timings["projection"] = time.perf_counter() - start
        return out

    return assemble
