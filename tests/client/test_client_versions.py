"""Target versions from the trainer's side, against real HF servers on loopback refreshed in place: a session
asks for the newest version or pins one, dispatch sends requests only to replicas at it, a batch prefetched
before a refresh is asked again, and every batch equals what a server started on those weights computes."""

from __future__ import annotations

import dataclasses
import json
import time
import types
import urllib.request

import pytest
from target_support import served

from eagle3_target.client import BatchFailedError, PoolOptions, RemoteTargetBackend
from eagle3_target.client.members import Member
from eagle3_target.client.versions import Versions, most_served
from eagle3_target.protocol.model_info import ModelInfo
from eagle3_target.server.options import ServerOptions
from eagle3_target.server.runners.hf import HFRunner
from eagle3_target.server.runners.tiny import build_tiny_llama

from .client_support import draft_vocab, make_batch, wait_until

pytestmark = pytest.mark.timeout(180)

ADMIN = "fleet-admin"
OPTIONS = dict(deadline=20.0, start_timeout=20.0, backoff_base=0.01, backoff_max=0.2, policy="round-robin")
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def weights_b(tmp_path_factory):
    path = tmp_path_factory.mktemp("weights-b")
    build_tiny_llama(seed=2).save_pretrained(path)
    return str(path)


def refresh(url: str, source: str, version: str) -> None:
    body = json.dumps({"source": source, "version": version}).encode()
    headers = {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"}
    request = urllib.request.Request(f"{url}/weights/refresh", data=body, headers=headers)
    with OPENER.open(request, timeout=60) as reply:
        assert json.load(reply) == {"version": version}


def fleet(farm, model_dir: str, *hosts: str) -> list[str]:
    options = ServerOptions(admin_token=ADMIN)
    return [farm.start(host, loader=lambda: HFRunner.load(model_dir), options=options) for host in hosts]


def backend(urls, **options) -> RemoteTargetBackend:
    client = RemoteTargetBackend(urls, options=PoolOptions(**{**OPTIONS, **options}))
    vocab = draft_vocab()
    client.set_vocab_mapping(vocab.selected_token_ids, vocab.selected_token_mask)
    client.wait_for_servers(20)
    return client


def generated(farm, url: str) -> float:
    return served(farm.server(url), "generate", "200")


def supervision_of(model_dir: str, farm, batches) -> list[dict]:
    """What a server started on ``model_dir`` answers: the reference every refreshed batch must equal."""
    url = farm.start("127.0.0.9", loader=lambda: HFRunner.load(model_dir))
    with backend(url) as client:
        want = [client.generate_batch(*b).as_dict() for b in batches]
    farm.stop(url)
    return want


def assert_same(got: list[dict], want: list[dict]) -> None:
    for have, reference in zip(got, want, strict=True):
        assert have.keys() == reference.keys()
        for key, value in reference.items():
            assert have[key].equal(value), key


def test_after_a_refresh_batches_come_only_from_the_new_weights_prefetched_ones_again(
    farm, tiny_model_dir, weights_b
):
    batches = [make_batch(seed, batch=2, seq=16) for seed in range(6)]
    want = supervision_of(weights_b, farm, batches)
    refreshed, other = fleet(farm, tiny_model_dir, "127.0.0.2", "127.0.0.3")
    with backend([refreshed, other], version_poll_interval=0.2) as client:
        assert client.target_version.startswith("sha256-")
        prefetched = [client.generate_batch_async(*b) for b in batches[:2]]
        wait_until(lambda: all(h.done() for h in prefetched))
        refresh(refreshed, weights_b, "policy-2")
        wait_until(lambda: client.target_version == "policy-2")
        before = generated(farm, other)
        taken = [h.result() for h in prefetched] + [client.generate_batch(*b) for b in batches[2:]]
        assert [batch.target_version for batch in taken] == ["policy-2"] * len(batches)  # each says so
        assert_same([batch.as_dict() for batch in taken], want)
        assert generated(farm, other) == before, "the replica at the old version was sent nothing"
        refresh(other, weights_b, "policy-2")
        wait_until(lambda: client.pool.members[other].version == "policy-2")  # its next poll
        for b in batches:
            client.generate_batch(*b)
        assert generated(farm, other) > before, "refreshed too, it serves again"


def test_a_pinned_version_waits_for_a_replica_at_it_then_only_it_serves(farm, tiny_model_dir, weights_b):
    batch = make_batch(3, batch=2, seq=16)
    (want,) = supervision_of(weights_b, farm, [batch])
    first, second = fleet(farm, tiny_model_dir, "127.0.0.2", "127.0.0.3")
    with backend([first, second], version_poll_interval=0.2) as client:
        client.pin_target_version("step-9")
        handle = client.generate_batch_async(*batch)
        time.sleep(1.0)
        assert not handle.done(), "no replica serves step-9 yet"
        refresh(second, weights_b, "step-9")
        assert_same([handle.result(30).as_dict()], [want])
        assert client.target_version == "step-9"
        assert generated(farm, first) == 0


def test_a_version_no_replica_serves_fails_at_the_deadline_naming_it(farm, tiny_model_dir):
    (url,) = fleet(farm, tiny_model_dir, "127.0.0.2")
    with (
        backend(url, target_version="step-9", deadline=1.0) as client,
        pytest.raises(
            BatchFailedError, match=r"none serves target version step-9 \(http://127.0.0.2:\d+ at sha256-"
        ),
    ):
        client.generate_batch(*make_batch(0))


def test_a_choice_that_is_no_version_is_refused_in_one_line():
    with pytest.raises(ValueError, match="^target_version is 'newest' or a target version is 1 to 128"):
        PoolOptions(target_version="policy step 9")


def member(version: str | None, refreshed_at: float | None = None) -> Member:
    return Member(
        conn=types.SimpleNamespace(url="http://127.0.0.2:1"), version=version, refreshed_at=refreshed_at
    )


def test_the_newest_is_the_latest_refresh_seen_and_never_goes_back():
    versions = Versions.__new__(Versions)
    versions.options, versions.members, versions.notify = PoolOptions(), {}, lambda: None
    info = ModelInfo(8, 64, 512, (1, 3, 4))
    startup, a, b = member(None), member(None), member(None)
    versions.learn(startup, dataclasses.replace(info, target_version="sha256-0"))
    versions.learn(a, dataclasses.replace(info, target_version="step-1", refreshed_at=100.0))
    versions.learn(b, dataclasses.replace(info, target_version="step-2", refreshed_at=200.0))
    assert versions.wanted_version() == "step-2"
    versions.learn(b, dataclasses.replace(info, target_version="sha256-0"))  # restarted on its checkpoint
    assert versions.wanted_version() == "step-2", "a restart does not make the old weights the newest"
    versions.pin("step-1")
    assert versions.wanted_version() == "step-1"
    versions.pin("newest")
    assert versions.wanted_version() == "step-2"


def test_before_any_refresh_the_newest_is_what_most_members_serve():
    assert most_served([member("sha256-b"), member("sha256-a"), member("sha256-b")]) == "sha256-b"
    assert most_served([member("sha256-b"), member("sha256-a")]) == "sha256-a"
    assert most_served([member(None)]) is None
