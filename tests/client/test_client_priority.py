"""A job's priority class (PoolOptions.priority) reaches the server on every /generate, and a server that
grants less refuses it with a clear error."""

from __future__ import annotations

import pytest

from eagle3_target.client import PoolOptions, RemoteTargetBackend, ServerError
from eagle3_target.server.options import ServerOptions

from .client_support import draft_vocab, make_batch

pytestmark = pytest.mark.timeout(60)

FAST = dict(deadline=10.0, start_timeout=10.0, backoff_base=0.01, backoff_max=0.2)


def waited(server, priority: str) -> float:
    """/generate requests the server scheduled in ``priority``'s class, from its queue-wait histogram."""
    name = "eagle3_target_generate_queue_wait_seconds_count"
    return server.metrics.registry.get_sample_value(name, {"priority": priority}) or 0.0


def run_batches(url: str, priority: str | None, n: int = 2) -> None:
    vocab = draft_vocab()
    with RemoteTargetBackend(url, options=PoolOptions(priority=priority, **FAST)) as backend:
        backend.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
        for seed in range(n):
            backend.generate_batch(*make_batch(seed))


@pytest.mark.parametrize("priority", ["low", "high"])
def test_a_jobs_priority_class_is_what_the_server_schedules_it_in(farm, priority):
    url = farm.start("127.0.0.2", options=ServerOptions(max_priority="high"))
    run_batches(url, priority)
    server = farm.server(url)
    assert [waited(server, p) for p in ("low", "normal", "high")] == [
        2.0 if p == priority else 0.0 for p in ("low", "normal", "high")
    ]


def test_a_job_that_names_no_class_runs_as_normal(farm):
    url = farm.start("127.0.0.2", options=ServerOptions(max_priority="high"))
    run_batches(url, None)
    assert waited(farm.server(url), "normal") == 2.0


def test_a_class_above_the_servers_bound_is_refused_by_name(farm):
    url = farm.start("127.0.0.2")  # grants up to normal
    with pytest.raises(ServerError) as refused:
        run_batches(url, "high", n=1)
    assert refused.value.status == 403 and refused.value.error == "priority_not_allowed"
    assert "up to 'normal'" in str(refused.value)


def test_an_unknown_class_is_refused_before_any_server_is_asked():
    with pytest.raises(ValueError, match="unknown priority 'urgent'; choose low, normal, high"):
        PoolOptions(priority="urgent")
