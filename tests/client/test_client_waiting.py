"""While the client waits for servers it says, every few seconds, which it cannot reach and why."""

import logging
import time

import pytest

from eagle3_target.client import BatchFailedError, EndpointError, PoolOptions, RemoteTargetBackend

from ..target_support import free_port


def warnings_naming(caplog, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


def test_a_wrong_url_is_named_with_its_reason_within_seconds(caplog):
    """A closed port: the default wait_log_interval (5 s) names it long before start_timeout."""
    caplog.set_level(logging.WARNING, logger="eagle3_target.client")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.time()
    with pytest.raises(BatchFailedError, match="no target server became ready within 12s"):
        RemoteTargetBackend(url, options=PoolOptions(start_timeout=12))
    warnings = warnings_naming(caplog, url)
    assert len(warnings) >= 2, [r.getMessage() for r in caplog.records]  # at ~5 s and ~10 s
    assert warnings[0].created - started < 7
    assert "Connection refused" in warnings[0].getMessage()
    assert warnings[1].created - warnings[0].created >= 4.5  # every few seconds, not in a busy loop


def test_a_name_that_does_not_resolve_is_named_with_the_dns_answer(caplog, dns_server):
    caplog.set_level(logging.WARNING, logger="eagle3_target.client")
    spec = "dns://missing.team.svc.cluster.local:8001"
    with pytest.raises(EndpointError, match="did not resolve in time"):
        RemoteTargetBackend(
            spec, nameserver=dns_server.address, options=PoolOptions(start_timeout=4, wait_log_interval=1)
        )
    warnings = warnings_naming(caplog, spec)
    assert warnings and "NXDOMAIN" in warnings[0].getMessage(), [r.getMessage() for r in caplog.records]
