"""The helm test's script (charts/eagle3-target/files/check_fleet.py) against real target servers on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import threading

from chart.render import CHART
from target_support import serve

from eagle3_target.server.runners.synthetic import SyntheticRunner

SCRIPT = CHART / "files" / "check_fleet.py"


async def run_check(env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SCRIPT.read_text(),  # as the test pod runs it: python3 -c <script>
        env={"PATH": os.environ.get("PATH", ""), "DEADLINE_S": "1", **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    return proc.returncode, out.decode()


async def test_passes_when_every_replica_and_the_service_answer():
    async with serve(SyntheticRunner, host="127.0.0.2") as a, serve(SyntheticRunner, host="127.0.0.3") as b:
        code, out = await run_check({"TARGET_URLS": f"{a.url} {b.url}", "SERVICE_URL": a.url})
    assert code == 0, out
    assert out.count("ok   ") == 3


async def test_fails_while_a_replica_is_still_loading():
    release = threading.Event()

    def slow_loader():
        release.wait(30)
        return SyntheticRunner()

    async with (
        serve(SyntheticRunner, host="127.0.0.2") as ready,
        serve(slow_loader, host="127.0.0.3", wait=False) as loading,
    ):
        try:
            code, out = await run_check({"TARGET_URLS": f"{ready.url} {loading.url}"})
        finally:
            release.set()
    assert code == 1, out
    assert f"ok   {ready.url}" in out
    assert f"FAIL {loading.url}/health answered 503" in out
    assert f"FAIL {loading.url}/metrics does not report eagle3_target_ready 1" in out


async def test_fails_when_nothing_listens():
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.2", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        code, out = await run_check({"TARGET_URLS": f"http://127.0.0.2:{port}"})
    assert code == 1
    assert "answered 0: URLError" in out


async def test_fails_without_urls():
    code, out = await run_check({})
    assert code == 1 and "no TARGET_URLS" in out
