"""Runs as a cluster would see them: workers in processes of their own writing one cache to a real S3
API (moto's server on loopback), a worker SIGKILLed mid-run and resumed, progress and counters."""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import fsspec
import pytest
from moto.server import ThreadedMotoServer
from target_support import TargetProcess, free_port

from eagle3_target.client.precompute.cache import VERSION_FILE
from eagle3_target.client.precompute.progress import Progress

from .precompute_support import argv, cache_files, cache_version, precompute, precompute_process

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture
def s3(monkeypatch):
    """A moto S3 server on loopback; the env that points fsspec (s3fs) at it."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {**S3_ENV, "FSSPEC_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    fs = fsspec.filesystem("s3", endpoint_url=env["FSSPEC_S3_ENDPOINT_URL"], skip_instance_cache=True)
    fs.mkdir("cache")
    try:
        yield fs, env
    finally:
        server.stop()


def test_two_worker_processes_write_to_s3_the_cache_one_writes_locally(hf_server, target, tmp_path, s3):
    fs, env = s3
    assert precompute(*argv(hf_server.url, tmp_path / "one", *target)) == 0
    # Worker index and count from the env, as an Indexed Job's pods get them.
    workers = [
        precompute_process(
            *argv(hf_server.url, "s3://cache/run", *target),
            env={**env, "JOB_COMPLETION_INDEX": str(i), "EAGLE3_TARGET_WORKER_COUNT": "2"},
        )
        for i in range(2)
    ]
    outputs = [w.communicate(timeout=240) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], [err[-2000:] for _, err in outputs]
    # Shard s belongs to worker s mod 2: shards 0 and 2 to the first, shard 1 to the second.
    assert [out.strip().splitlines()[-1].split(":")[1].split(",")[:2] for out, _ in outputs] == [
        [" 8 samples", " 2 shards"],
        [" 4 samples", " 1 shards"],
    ]
    stored = {p.rsplit("/", 1)[-1]: fs.cat(p) for p in fs.ls("cache/run", detail=False, refresh=True)}
    version = json.loads(stored.pop(VERSION_FILE))["target_version"]  # ours, beside NeMo's files
    assert stored == cache_files(tmp_path / "one") and version == cache_version(tmp_path / "one")


def test_a_sigkilled_worker_leaves_whole_shards_and_resumes_to_the_same_bytes(
    slow_fleet, target, tmp_path, caplog
):
    server, model = slow_fleet
    chats = target[1]
    flags = ["--skip-config-digest"]
    assert precompute(*argv(server.url, tmp_path / "whole", model, chats, *flags)) == 0
    reference = cache_files(tmp_path / "whole")
    killed = tmp_path / "killed"
    worker = precompute_process(*argv(server.url, killed, model, chats, *flags))
    deadline = time.monotonic() + 240
    while not (killed / "shard-000000.safetensors").exists():
        assert worker.poll() is None, worker.communicate()[1][-2000:]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    worker.send_signal(signal.SIGKILL)
    assert worker.wait(30) == -signal.SIGKILL
    left = cache_files(killed)
    shards = [name for name in left if name.startswith("shard-")]
    assert 1 <= len(shards) < 3, "killed after the first shard and before the last"
    assert all(left[name] == reference[name] for name in left), "every file is whole, or absent"

    metrics = tmp_path / "precompute.prom"
    resumed = argv(server.url, killed, model, chats, *flags, "--resume", "--metrics-file", str(metrics))
    with caplog.at_level(logging.INFO, logger="eagle3_target.precompute"):
        assert precompute(*resumed, "--log-interval", "0") == 0  # off a terminal: a line per batch
    assert cache_files(killed) == reference
    assert re.search(r"\d+/\d+ samples, [\d,]+ tokens/s, [\d.,]+ MB/s", caplog.text), caplog.text
    counters = dict(
        line.rsplit(" ", 1) for line in metrics.read_text().splitlines() if not line.startswith("#")
    )
    remaining = 3 - len(shards)
    assert float(counters["eagle3_precompute_shards_total"]) == remaining
    assert float(counters["eagle3_precompute_samples_total"]) == 4 * remaining
    assert float(counters["eagle3_precompute_bytes_total"]) == sum(
        len(reference[f"shard-{i:06d}.safetensors"]) for i in range(3 - remaining, 3)
    )


def test_resume_refuses_a_cache_made_with_other_settings(slow_fleet, target, tmp_path, capsys):
    server, model = slow_fleet
    first = argv(server.url, tmp_path, model, target[1], "--skip-config-digest")
    assert precompute(*first) == 0
    before = cache_files(tmp_path)
    capsys.readouterr()
    assert precompute(*first, "--resume", "--shuffle-seed", "7") == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(
        f"eagle3-target precompute: error: {tmp_path} holds a cache made with other settings"
    )
    assert "['shuffle_seed']" in last
    assert cache_files(tmp_path) == before


def test_a_priority_class_the_fleet_does_not_grant_is_refused_in_one_line(
    slow_fleet, target, tmp_path, capsys
):
    server, model = slow_fleet  # grants up to normal, the default
    assert precompute(
        *argv(server.url, tmp_path, model, target[1], "--skip-config-digest"), "--priority", "high"
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert "priority_not_allowed" in lines[-1] and "up to 'normal'" in lines[-1], lines[-1]
    assert not any(name.startswith("shard") for name in cache_files(tmp_path))


def test_a_server_killed_mid_run_changes_no_byte(slow_fleet, target, tmp_path):
    """Failover under precompute: the batches of a SIGKILLed server go to the other; the cache is the same."""
    server, model = slow_fleet
    flags = ["--skip-config-digest"]
    assert precompute(*argv(server.url, tmp_path / "alone", model, target[1], *flags)) == 0
    victim = TargetProcess("127.0.0.10", "--engine", "synthetic", "--forward-delay", "0.25").wait_ready()
    at_kill = []  # what the other server had answered when the victim died

    def kill_once_it_served() -> None:
        while victim.generated() < 1:
            time.sleep(0.05)
        at_kill.append(server.generated())
        victim.kill()

    killer = threading.Thread(target=kill_once_it_served, daemon=True)
    killer.start()
    try:
        fleet = f"{server.url},{victim.url}"
        assert precompute(*argv(fleet, tmp_path / "failover", model, target[1], *flags)) == 0
        killer.join(10)
        assert victim.process.returncode == -signal.SIGKILL, "the victim must die mid-run"
        # Mid-run: the other server answered batches of this run after the victim died.
        assert at_kill and server.generated() > at_kill[0], (at_kill, server.generated())
    finally:
        victim.kill()
    assert cache_files(tmp_path / "failover") == cache_files(tmp_path / "alone")


def test_metrics_are_served_while_the_run_lasts():
    port = free_port()
    progress = Progress(8, worker="1/1", metrics_port=port)
    progress.batch(samples=2, tokens=50)
    progress.shard(1000)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}/", timeout=5) as r:
        text = r.read().decode()
    for line in (
        "eagle3_precompute_samples_total 2.0",
        "eagle3_precompute_tokens_total 50.0",
        "eagle3_precompute_bytes_total 1000.0",
        "eagle3_precompute_shards_total 1.0",
        "eagle3_precompute_planned_samples 8.0",
    ):
        assert line in text.splitlines(), text
    progress.close()
    assert progress.summary().startswith("precompute 1/1: 2 samples, 1 shards, 1,000 bytes in ")
    with pytest.raises(OSError):  # closed with the run
        opener.open(f"http://127.0.0.1:{port}/", timeout=2)


WRITER = """
import sys
from eagle3_target.client.precompute.store import CacheStore
CacheStore(sys.argv[1]).write("shard-000001.safetensors", bytes(1 << 29))
"""


def test_a_process_killed_while_writing_a_shard_leaves_no_shard_and_resume_clears_it(
    slow_fleet, target, tmp_path
):
    server, model = slow_fleet
    cache = tmp_path / "cache"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(cache)])
    deadline = time.monotonic() + 120
    while not any(p.stat().st_size > 0 for p in cache.glob(".shard-000001.*.tmp")):
        assert writer.poll() is None and time.monotonic() < deadline
        time.sleep(0.001)
    writer.send_signal(signal.SIGKILL)
    assert writer.wait(30) == -signal.SIGKILL
    (partial,) = cache.iterdir()
    assert partial.name.startswith(".shard-000001.safetensors.") and partial.stat().st_size < 1 << 29
    assert precompute(*argv(server.url, cache, model, target[1], "--skip-config-digest", "--resume")) == 0
    assert sorted(p.name for p in cache.iterdir()) == [
        "manifest.json",
        *(f"shard-{i:06d}.safetensors" for i in range(3)),
        "target_embeddings.safetensors",
        VERSION_FILE,
    ]
