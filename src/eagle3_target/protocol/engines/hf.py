"""HF transformers: any causal LM, or an image-text model on one device (server/runners/hf.py); split by
transformers' own tensor parallel plan or into pipeline stages, one way at a time, over one node or several."""

from ..engine_spec import PIPELINE, TENSOR, Engine

ENGINE = Engine(
    name="hf",
    summary="HF transformers",
    load="eagle3_target.server.runners.hf:HFRunner.load",
    load_split="eagle3_target.server.runners.hf_parallel:load",
    splits=frozenset({TENSOR, PIPELINE}),
    nodes=True,
    follow="eagle3_target.server.runners.hf_parallel:follow",
    rank="eagle3_target.server.runners.hf_parallel:follow_group",
    image_text=True,
)
