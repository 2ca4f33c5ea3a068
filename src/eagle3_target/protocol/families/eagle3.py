"""EAGLE-3 (NeMo's TrainEagle3Recipe): three aux layers, target_probs over the draft vocabulary, shifted.

The same tensors as the "nemo" encoding: asked of a server whose own aux layers they are, the request goes
as NeMo's (no header, the negotiated encoding; client/agreement.py), so a stock NeMo server serves it.
"""

from ..family_spec import Family
from ..features import WEIGHT_INPUT_EMBEDDINGS, supervision_request

FAMILY = Family(
    name="eagle3",
    ask=lambda layers, _n: supervision_request(layers),
    weights=(WEIGHT_INPUT_EMBEDDINGS,),
)
