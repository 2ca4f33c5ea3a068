"""SGLang (server/runners/sglang.py, docs/sglang.md): GPU only; tensor parallel over one node's GPUs, as NeMo's
serve_target --tp-size."""

from ..engine_spec import TENSOR, Engine

ENGINE = Engine(
    name="sglang",
    summary="SGLang",
    load="eagle3_target.server.runners.sglang:SGLangRunner.load",
    load_split="eagle3_target.server.runners.sglang_parallel:load",
    splits=frozenset({TENSOR}),
    rank="eagle3_target.server.runners.sglang_parallel:follow_group",
    devices=("cuda",),
    package="sglang",
    needs_model=True,
)
