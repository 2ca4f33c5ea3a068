"""A model-free stand-in with deterministic outputs (server/runners/synthetic.py), for benches and tests: one
device, no config to read, not deployed by the operator."""

from ..engine_spec import Engine

ENGINE = Engine(
    name="synthetic",
    summary="a synthetic model",
    load="eagle3_target.server.runners.synthetic:SyntheticRunner",
    options=("forward_delay",),
    layers=32,  # SyntheticRunner's default shape
    fleet=False,
)
