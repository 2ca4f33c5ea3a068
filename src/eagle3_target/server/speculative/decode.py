"""The draft-then-verify loop for one prompt, greedy: each step the draft proposes K tokens, one target forward
over the pending token and the K proposals scores them, and the longest prefix the target's own argmax agrees
with is kept, plus the target's next token. So the output is the target's greedy output whatever the draft
proposes (lossless); a better draft only makes each step give more tokens.

The target keeps a KV cache (transformers' DynamicCache, cut back past the rejected proposals); its aux hidden
states come from forward hooks at the server's aux layers, as the supervision's do. The draft is NeMo's EAGLE-3
draft as vLLM runs one: at draft position i it reads token i+1 and the target's aux states at i (projected by its
`fc`), and a drafted position reads the draft's own output state at the position before. It is rerun over the
whole sequence for each proposal (NeMo's draft has no inference KV cache). With K = 0 the loop is plain greedy
decoding with a KV cache, the baseline evaluation is measured against.

Each method runs on the model thread, one step per turn at the model (evaluate.py).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ..runners.hf import HFRunner, decoder_layers
from ..runners.hf_generate import cache_argument
from ..runners.hf_vlm import embedding_output_point
from .drafts import Draft


class Decoding:
    """One prompt's speculative decoding state: the target's cache, the draft's inputs, the counts so far."""

    def __init__(
        self, runner: HFRunner, draft: Draft | None, prompt: list[int], k: int, max_tokens: int, eos: set[int]
    ):
        self.runner, self.draft, self.k, self.max_tokens, self.eos = runner, draft, k, max_tokens, eos
        self.prompt = prompt
        self.device = runner.info.device
        self.cache = DynamicCache()
        self.output: list[int] = []
        self.accepted: list[int] = []  # tokens each verify step gave: 1 + the proposals it accepted
        self.per_position = [0] * k  # steps whose j-th proposal was accepted
        self.draft_ids: torch.Tensor | None = None  # [1, L]: the token after each position
        self.draft_hidden: torch.Tensor | None = None  # [1, L, H]: the draft's hidden input at each position

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_tokens or bool(self.output and self.output[-1] in self.eos)

    @torch.inference_mode()
    def prefill(self) -> None:
        """The prompt's forward: the first output token, and the draft's inputs up to it."""
        logits, aux = self._target(self.prompt)
        first = int(logits[-1].argmax())
        self._emit([first])
        if self.draft is not None:
            self.draft_ids = torch.tensor([self.prompt[1:] + [first]], device=self.device)
            self.draft_hidden = self.draft.model.project_hidden_states(aux[None])

    @torch.inference_mode()
    def step(self) -> None:
        """Propose K tokens, verify them in one target forward, keep what the target's argmax agrees with."""
        proposals = self._propose() if self.k else []
        logits, aux = self._target([self.output[-1], *proposals])
        greedy = logits.argmax(-1).tolist()
        accepted = 0
        while accepted < len(proposals) and proposals[accepted] == greedy[accepted]:
            self.per_position[accepted] += 1
            accepted += 1
        new = greedy[: accepted + 1]
        if accepted < len(
            proposals
        ):  # the rejected proposals leave the cache (a negative crop drops that many)
            self.cache.crop(accepted - len(proposals))
        self.accepted.append(accepted + 1)
        self._emit(new)
        if self.draft is not None:
            ids = torch.tensor([new], device=self.device)
            self.draft_ids = torch.cat([self.draft_ids, ids], dim=1)
            projected = self.draft.model.project_hidden_states(aux[None, : accepted + 1])
            self.draft_hidden = torch.cat([self.draft_hidden, projected], dim=1)

    def _emit(self, tokens: list[int]) -> None:
        """Append up to max_tokens, stopping after an end-of-sequence token as generate() does."""
        for token in tokens:
            if self.done:
                return
            self.output.append(token)

    def _propose(self) -> list[int]:
        model, ids, hidden = self.draft.model, self.draft_ids, self.draft_hidden
        proposals = []
        for _ in range(self.k):
            out = model(input_ids=ids, projected_hidden_states=hidden, attention_mask=torch.ones_like(ids))
            token = self.draft.target_ids(model.compute_logits(out[:, -1:]).argmax(-1))
            proposals.append(int(token))
            ids, hidden = torch.cat([ids, token], dim=1), torch.cat([hidden, out[:, -1:]], dim=1)
        return proposals

    def _target(self, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [T, V] and concatenated aux states [T, 3H] of ``tokens`` after the cached ones."""
        model, captured = self.runner.model, {}
        layers = decoder_layers(model)

        def keep(key):
            def hook(_module, _args, output):
                captured[key] = output[0] if isinstance(output, tuple) else output

            return hook

        ids = self.runner.info.aux_layer_ids
        hooks = [
            layers[i].register_forward_hook(keep(i)) if i >= 0 else embedding_output_point(model, keep(i))
            for i in ids
        ]
        try:
            out = model(
                input_ids=torch.tensor([tokens], device=self.device),
                **{cache_argument(model): self.cache},
                use_cache=True,
            )
        finally:
            for hook in hooks:
                hook.remove()
        return out.logits[0], torch.cat([captured[i] for i in ids], dim=-1)[0]
