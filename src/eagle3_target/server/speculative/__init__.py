"""Speculative decoding on the server: a trained draft proposes, the target verifies (POST /v1/speculative/evaluate).

drafts.py finds and loads a draft checkpoint under --draft-dir-root; decode.py is the draft-then-verify loop on the
model thread; evaluate.py validates a request and runs its steps in turns at the model (scheduler.py). On the
vllm engine, vllm_evaluate.py runs vLLM's own EAGLE-3 speculative decoding in an evaluation engine of its own
(vllm_child.py) with the draft exported as vLLM loads it (vllm_draft.py).
"""
