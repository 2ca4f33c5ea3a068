"""The embedded default target: a small Llama built deterministically, so nothing is downloaded."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

TINY_LLAMA = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)


def build_tiny_llama(seed: int = 0, **overrides) -> LlamaForCausalLM:
    """Same seed, same torch build: same weights, on any machine."""
    # architectures as save_pretrained writes it: the embedded default's config digest is its checkpoint's
    config = LlamaConfig(**{"architectures": [LlamaForCausalLM.__name__], **TINY_LLAMA, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval()


# The tiny tokenizer: a word per token ("w0" ...) after the special ones, so it fills the vocabulary exactly.
TINY_SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "user", "assistant", ":"]
# A turn is "<s> role : content </s>"; NeMo's recipe trains only on the assistant's turns ({% generation %}
# marks them); a generation prompt opens the assistant's turn.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} : "
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }} </s>{% endgeneration %}"
    "{% else %}{{ m['content'] }} </s>{% endif %} {% endfor %}"
    "{% if add_generation_prompt %}<s> assistant : {% endif %}"
)


def tiny_words() -> list[str]:
    return [f"w{i}" for i in range(TINY_LLAMA["vocab_size"] - len(TINY_SPECIAL))]


def build_tiny_tokenizer():
    """The embedded target's word-level tokenizer with its chat template (built here: nothing is downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocabulary = {t: i for i, t in enumerate(TINY_SPECIAL + tiny_words())}
    word_level = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=word_level, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer
