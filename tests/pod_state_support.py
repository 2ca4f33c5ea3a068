"""One operator pod as the planner reads it (operator/planner.PodState), for the operator's pure tests."""

from eagle3_target.operator.planner import PodState


def pod_state(ordinal: int, spec_hash: str = "new", ready: bool = True, **kw) -> PodState:
    """A Running pod of ordinal ``ordinal`` at 10.0.0.(ordinal + 2):8001; ``kw`` replaces any field."""
    fields = dict(
        name=f"t-{ordinal}",
        ordinal=ordinal,
        spec_hash=spec_hash,
        ready=ready,
        ip=f"10.0.0.{ordinal + 2}",
        http_port=8001,
        phase="Running",
        terminating=False,
        failing_reason=None,
    )
    return PodState(**{**fields, **kw})
