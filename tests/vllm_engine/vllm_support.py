"""Shared by the vLLM tests: whether vLLM is here, and the tiny Llama shape its CPU backend runs."""

import importlib.util

VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None
# vLLM's CPU attention needs head_dim >= 32: the embedded tiny Llama's is 16.
VLLM_TINY = dict(num_attention_heads=2, num_key_value_heads=1)
AUX_LAYER_IDS = [1, 3, 7]  # the last layer too: vLLM's deferred residual add must be undone there as well
