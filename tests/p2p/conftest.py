"""Fixtures of the p2p tests."""

import signal
import subprocess

import pytest

from .p2p_support import start_server


@pytest.fixture(scope="module")
def server_process():
    server = start_server()
    yield server
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
