import logging
import os
from pathlib import Path

# An xdist worker prints what its imports log before pytest captures it: torch's and torchao's import-time
# warnings would fill the run's output (the CLI quiets the same ones, cli.QUIET_ENV).
os.environ.setdefault("TORCH_LOGS", "-torch")
logging.getLogger("torchao").setLevel(logging.ERROR)

import pytest  # noqa: E402
from tiers import IN_CI  # noqa: E402

from eagle3_target.server.runners.tiny import build_tiny_llama  # noqa: E402

TESTS = Path(__file__).resolve().parent
CLUSTER_TIER = TESTS / "cluster"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "skip_ok_in_ci: a skip CI accepts (no CI machine can meet the condition; tests/tiers.py)"
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(config, items):
    """Under `-n N --dist loadgroup` a file runs whole on one worker, so its module-scoped servers start once,
    and the cluster tier (one kubelet node, one control plane) runs whole on one worker, first: it is the
    longest group and mostly waits on Kubernetes, which leaves the other worker the CPU."""
    for item in items:
        cluster = CLUSTER_TIER in item.path.parents
        item.add_marker(
            pytest.mark.xdist_group("cluster" if cluster else item.path.relative_to(TESTS).as_posix())
        )
    items.sort(key=lambda item: CLUSTER_TIER not in item.path.parents)  # stable: file order kept


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI a skip is a failure (tests/tiers.py), so no tier goes missing without anyone noticing."""
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and not item.get_closest_marker("skip_ok_in_ci"):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where every tier must run: {report.longrepr}"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny random Llama, saved with save_pretrained, as a real model directory."""
    path = tmp_path_factory.mktemp("tiny-llama")
    build_tiny_llama(seed=1).save_pretrained(path)
    return str(path)
