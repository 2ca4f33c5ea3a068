"""A draft trainer with its own loop against a target fleet: a tiny EAGLE-3-style draft, its loss and its
optimizer, fed by `RemoteTargetBackend`.

    python examples/own_trainer.py                    # starts `eagle3-target serve` (embedded model) itself
    python examples/own_trainer.py http://HOST:8001   # or trains against servers already running

The draft sees the target's three aux hidden states and learns the target's next-token distribution over a
draft vocabulary (the first --draft-vocab token ids here; a real trainer picks the most frequent ones).
It needs the client extra: pip install 'eagle3-target[client]' (and [server] to start the embedded server).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys

import torch
import torch.nn.functional as F

from eagle3_target.client import RemoteTargetBackend, TargetBatch


class TinyDraft(torch.nn.Module):
    """Fuses the three aux hidden states into one, adds the token's embedding and predicts draft tokens."""

    def __init__(self, embeddings: torch.nn.Embedding, hidden: int, draft_vocab: int):
        super().__init__()
        self.embeddings = embeddings  # the target's own, frozen
        self.fuse = torch.nn.Linear(3 * hidden, hidden)
        self.block = torch.nn.Sequential(torch.nn.LayerNorm(2 * hidden), torch.nn.Linear(2 * hidden, hidden))
        self.head = torch.nn.Linear(hidden, draft_vocab)

    def forward(self, aux_hidden_states: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        fused = self.fuse(aux_hidden_states.float())
        tokens = self.embeddings(input_ids).float()
        return self.head(F.silu(self.block(torch.cat([fused, tokens], dim=-1))))


def draft_loss(logits: torch.Tensor, batch: TargetBatch) -> torch.Tensor:
    """KL divergence from the target's distribution to the draft's (cross-entropy less the target's own
    entropy, so a perfect draft scores 0), over the positions the target supervises."""
    keep = batch.position_mask.squeeze(-1) & batch.loss_mask.bool()
    per_position = F.kl_div(F.log_softmax(logits, dim=-1), batch.target_probs, reduction="none").sum(-1)
    return (per_position * keep).sum() / keep.sum().clamp(min=1)


def batches(vocab: int, steps: int, batch_size: int, seq_len: int):
    """A few fixed token sequences, cycled: enough structure for the loss to fall within a minute."""
    pool = torch.randint(0, vocab, (4, batch_size, seq_len), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(batch_size, seq_len, dtype=torch.int64)
    for step in range(steps):
        yield pool[step % len(pool)], mask, mask


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def embedded_server():
    """`eagle3-target serve` on loopback with the embedded tiny Llama; the backend waits until it is ready."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "eagle3_target.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=60)


def train(endpoints: str, steps: int, draft_vocab: int, lr: float) -> list[float]:
    torch.manual_seed(0)
    with RemoteTargetBackend(endpoints) as target:
        info = target.model_info()
        target.set_vocab_mapping(torch.arange(draft_vocab), torch.arange(info["vocab_size"]) < draft_vocab)
        draft = TinyDraft(target.get_input_embeddings(), info["hidden_size"], draft_vocab)
        optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=lr)
        losses = []
        # prefetch keeps the servers busy while the draft trains on the batch before
        for step, batch in enumerate(target.prefetch(batches(info["vocab_size"], steps, 4, 64)), 1):
            loss = draft_loss(draft(batch.aux_hidden_states, batch.input_ids), batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
            if step % 10 == 0 or step == steps:
                print(f"step {step:4d}  KL {loss.item():.4f}", flush=True)
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("endpoints", nargs="?", default=os.environ.get("EAGLE3_TARGET_SERVICE"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--draft-vocab", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        endpoints = args.endpoints or stack.enter_context(embedded_server())
        losses = train(endpoints, args.steps, args.draft_vocab, args.lr)
    print(f"KL {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps")


if __name__ == "__main__":
    main()
