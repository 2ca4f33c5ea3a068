"""DSpark (HFDSparkTargetModel): target_layer_ids concatenated, where the last layer id means the post-norm
hidden state and -1 the embedding output, plus the post-norm last hidden state, unshifted.

The last layer is asked as final_hidden (sent once); the adapter puts it in its place in the concatenation.
"""

from ..family_spec import Family
from ..features import WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD, Features


def ask(layers, num_hidden_layers: int) -> Features:
    return Features(layers=tuple(i for i in layers if i != num_hidden_layers - 1), final_hidden=True)


FAMILY = Family(
    name="dspark",
    ask=ask,
    weights=(WEIGHT_INPUT_EMBEDDINGS, WEIGHT_LM_HEAD),
)
