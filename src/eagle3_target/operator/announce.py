"""Warning Events on a target: one per new reason it is degraded or its pods wait on, never one per pass."""

from __future__ import annotations

from .kube import Children
from .planner import FAILING_REASONS

ANNOUNCED = ("InvalidSpec", "FailedCreate", "GroupUnschedulable")  # Degraded reasons that become Warnings


async def announce(children: Children, body: dict, previous: dict, status: dict) -> None:
    """A Warning Event for an invalid spec or refused pods (one per distinct message), and for each new
    reason pods wait on (one per reason, not one per pass or per pod)."""

    def find(block: dict, type_: str) -> dict:
        return next((c for c in block.get("conditions") or [] if c.get("type") == type_), {})

    now, before = find(status, "Degraded"), find(previous, "Degraded")
    if now.get("reason") in ANNOUNCED and (now.get("reason"), now.get("message")) != (
        before.get("reason"),
        before.get("message"),
    ):
        await children.post_event(body, "Warning", now["reason"], now["message"])
    ready, was = find(status, "Ready"), find(previous, "Ready")
    if ready.get("reason") in FAILING_REASONS and ready["reason"] != was.get("reason"):
        await children.post_event(body, "Warning", ready["reason"], ready["message"])
