"""Feature requests: what a draft family asks of the target per batch, negotiated like the encodings.

A client that wants something other than EAGLE-3's supervision sends ``X-Eagle3-Features`` on
/generate with a ``Features`` as compact JSON; the server computes only that and echoes the header.
A stock NeMo client sends no such header and gets NeMo's bytes. /model_info lists what a server can
capture (``ModelInfo.features``) and which weights it hands out (``ModelInfo.weights``).

Torch-free: the operator and the CLI may import it. The tensors' shapes and the reply's assembly
live in capture.py.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

# What /generate may return besides EAGLE-3's encodings.
LOGITS_NONE, LOGITS_FULL, LOGITS_DRAFT_PROBS = "none", "full", "draft_probs"
LOGITS_CHOICES = (LOGITS_NONE, LOGITS_FULL, LOGITS_DRAFT_PROBS)
EMBEDDING_OUTPUT = -1  # a layer id: the embedding module's output (HF's hidden_states[0])

# Capabilities a server lists in /model_info "features".
CAN_LAYERS = "layers"  # decoder-layer outputs 0..L-1
CAN_EMBEDDING = "embedding_output"  # layer -1
CAN_FINAL_HIDDEN = "final_hidden"  # the post-norm last hidden state
CAN_LOGITS = "logits"  # full-vocabulary logits, unshifted or shifted
CAN_DRAFT_PROBS = "draft_probs"  # EAGLE-3's target_probs over the session's draft vocabulary
CAN_IMAGE_MASK = "image_mask"  # input_ids == the image token id, from an image-text target
CAN_PACKING = "packing"  # NeMo's packing metadata (position_ids, seq_lens) in the body [i32-pack]

# Weights a trainer fetches once (POST /weights/<name>): [V, H], [V, H], [H].
WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD, WEIGHT_FINAL_NORM = "input_embeddings", "lm_head", "final_norm"
WEIGHT_NAMES = (WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD, WEIGHT_FINAL_NORM)

# Reply keys, in send order.
KEY_HIDDEN, KEY_FINAL, KEY_LOGITS, KEY_IMAGE_MASK = "hidden_states", "final_hidden", "logits", "image_mask"
CAPTURE_KEYS = (KEY_HIDDEN, KEY_FINAL, KEY_LOGITS, KEY_IMAGE_MASK)  # what ``shift`` may name
# ``shift: true`` in a header: the captures NeMo's EAGLE-3 supervision shifts (the header's first spelling)
SUPERVISION_SHIFT = (KEY_LOGITS, KEY_IMAGE_MASK)
MAX_LAYERS = 256
MAX_HEADER_CHARS = 4096


class FeatureError(ValueError):
    """A feature request that is malformed, or that a server cannot honour.

    ``error`` is the short machine-readable name the server answers with.
    """

    def __init__(self, error: str, detail: str):
        super().__init__(detail)
        self.error, self.detail = error, detail


@dataclass(frozen=True)
class Features:
    """What one /generate returns; every field's default asks for nothing.

    layers: decoder-layer outputs, HF's ``hidden_states[i + 1]`` (before the final norm), -1 the
        embedding output; concatenated in this order on the last dim as "hidden_states" [B, S, n*H].
    final_hidden: the post-norm last hidden state (what the lm_head reads) as "final_hidden" [B, S, H].
    logits: "none"; "full" ([B, S, V] as "logits", the target's dtype); "draft_probs" (EAGLE-3's
        target_probs, position_mask, input_ids and loss_mask over the session's draft vocabulary).
    shift: the captures (CAPTURE_KEYS) returned shifted left as NeMo's ``_shift_left_with_zero`` shifts:
        along the sequence (dim 1), ``out[:, i] = x[:, i + 1]`` for ``i < S - 1`` and ``out[:, S - 1] = 0``,
        row by row, packed rows included (a copy: exact). ``True`` names the logits and the image mask
        among those asked (SUPERVISION_SHIFT), ``False`` none. "draft_probs" are of the shifted logits, so
        they need "logits" here.
    image_mask: an image-text target's ``input_ids == image_token_id`` as "image_mask" [B, S] bool
        (ViSpec's); left out of the header when false, so requests without it read as before.
    """

    layers: tuple[int, ...] = ()
    final_hidden: bool = False
    logits: str = LOGITS_NONE
    shift: tuple[str, ...] | bool = ()
    image_mask: bool = False

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(self.layers))
        problem = self._shift_problem() or self._problem()
        if problem:
            raise FeatureError(*problem)

    def _problem(self) -> tuple[str, str] | None:
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in self.layers):
            return "bad_features", f"layers must be integers, got {list(self.layers)!r:.200}"
        if len(self.layers) > MAX_LAYERS:
            return "bad_features", f"at most {MAX_LAYERS} layers, got {len(self.layers)}"
        duplicates = sorted({i for i in self.layers if self.layers.count(i) > 1})
        if duplicates:
            return "duplicate_layer", f"layers {duplicates} are asked for more than once"
        if any(i < EMBEDDING_OUTPUT for i in self.layers):
            return (
                "layer_out_of_range",
                f"layer ids are -1 (the embeddings) or above, got {list(self.layers)}",
            )
        if self.logits == LOGITS_DRAFT_PROBS and KEY_LOGITS not in self.shift:
            return "bad_features", "draft_probs are EAGLE-3's shifted supervision: shift the logits"
        if not (self.layers or self.final_hidden or self.logits != LOGITS_NONE or self.image_mask):
            return "bad_features", "the request asks for nothing: name layers, final_hidden or logits"
        return None

    def _shift_problem(self) -> tuple[str, str] | None:
        """``shift`` as the captures it names, in CAPTURE_KEYS order; a problem with it or the flags."""
        if not all(isinstance(v, bool) for v in (self.final_hidden, self.image_mask)):
            return "bad_features", "final_hidden and image_mask are true or false"
        if self.logits not in LOGITS_CHOICES:
            return "bad_features", f"logits is one of {', '.join(LOGITS_CHOICES)}, got {self.logits!r:.50}"
        asked = self.captures
        if isinstance(self.shift, bool):
            names = tuple(k for k in SUPERVISION_SHIFT if k in asked) if self.shift else ()
            if self.shift and not names:
                return "bad_features", "shift=true shifts the logits and the image mask: ask for one"
        elif isinstance(self.shift, (list, tuple)) and all(isinstance(k, str) for k in self.shift):
            names = tuple(self.shift)
        else:
            return "bad_features", f"shift is true, false or a list of {', '.join(CAPTURE_KEYS)}"
        if len(set(names)) != len(names) or not set(names) <= set(asked):
            return (
                "bad_features",
                f"shift names captures asked for ({', '.join(asked)}) once each: {names!r:.200}",
            )
        object.__setattr__(self, "shift", tuple(k for k in CAPTURE_KEYS if k in names))
        return None

    @property
    def captures(self) -> tuple[str, ...]:
        """The captures asked for, as ``shift`` names them (draft_probs count as the logits)."""
        flags = (bool(self.layers), self.final_hidden, self.logits != LOGITS_NONE, self.image_mask)
        return tuple(k for k, asked in zip(CAPTURE_KEYS, flags, strict=True) if asked)

    # -- the header ----------------------------------------------------------------------------

    def to_header(self) -> str:
        """Compact JSON, keys in field order: the same request always reads the same."""
        doc = asdict(self)
        doc["layers"] = list(self.layers)
        # the first spelling where it says the same, so a request that shifts nothing else reads as before
        legacy = tuple(k for k in SUPERVISION_SHIFT if k in self.captures)
        doc["shift"] = bool(self.shift) if self.shift in ((), legacy) else list(self.shift)
        if not self.image_mask:
            del doc["image_mask"]
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_header(cls, text: str) -> Features:
        """Parse ``X-Eagle3-Features``; FeatureError names what is wrong."""
        if len(text) > MAX_HEADER_CHARS:
            raise FeatureError("bad_features", f"the features header is over {MAX_HEADER_CHARS} characters")
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError) as exc:  # RecursionError: deeply nested arrays
            raise FeatureError("bad_features", f"the features header is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise FeatureError("bad_features", "the features header is a JSON object")
        unknown = sorted(set(doc) - {"layers", "final_hidden", "logits", "shift", "image_mask"})
        if unknown:
            raise FeatureError("bad_features", f"unknown feature fields {unknown}")
        if not isinstance(doc.get("layers", []), list):
            raise FeatureError("bad_features", "layers is a list of integers")
        shift = doc.get("shift", ())
        return cls(**{**doc, "layers": tuple(doc.get("layers", ())), "shift": shift})

    # -- what it needs of a server ---------------------------------------------------------------

    def needs(self) -> tuple[str, ...]:
        """The capabilities (CAN_*) a server must list in /model_info to serve this request."""
        needs = []
        if any(i >= 0 for i in self.layers):
            needs.append(CAN_LAYERS)
        if EMBEDDING_OUTPUT in self.layers:
            needs.append(CAN_EMBEDDING)
        if self.final_hidden:
            needs.append(CAN_FINAL_HIDDEN)
        if self.logits == LOGITS_FULL:
            needs.append(CAN_LOGITS)
        if self.logits == LOGITS_DRAFT_PROBS:
            needs.append(CAN_DRAFT_PROBS)
        if self.image_mask:
            needs.append(CAN_IMAGE_MASK)
        return tuple(needs)

    def check(
        self, num_hidden_layers: int, offered: tuple[str, ...] | None, server: str = "the server"
    ) -> None:
        """Raise FeatureError unless a server with this many layers and these capabilities can serve it."""
        bad = [i for i in self.layers if i >= num_hidden_layers]
        if bad:
            raise FeatureError(
                "layer_out_of_range",
                f"layers {bad} are out of range: {server}'s target has layers 0..{num_hidden_layers - 1} "
                "(and -1, the embeddings)",
            )
        missing = [n for n in self.needs() if n not in (offered or ())]
        if missing:
            raise FeatureError(
                "feature_not_offered",
                f"{server} cannot capture {', '.join(missing)} "
                f"(it offers {', '.join(offered or ()) or 'no feature requests'})",
            )

    @property
    def reply_keys(self) -> tuple[str, ...]:
        """The reply's keys in send order (draft_probs adds EAGLE-3's four after the hidden states)."""
        keys = [KEY_HIDDEN] if self.layers else []
        keys += [KEY_FINAL] if self.final_hidden else []
        if self.logits == LOGITS_FULL:
            keys.append(KEY_LOGITS)
        elif self.logits == LOGITS_DRAFT_PROBS:
            keys += ["target_probs", "position_mask", "input_ids", "loss_mask"]
        return tuple(keys) + ((KEY_IMAGE_MASK,) if self.image_mask else ())
