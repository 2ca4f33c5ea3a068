"""Tiers of the suite that need something beyond the Python install (promtool, a Kubernetes, built images, a GPU).

On a user's machine a tier whose tool is absent skips with one line: what is missing and how to get it. In CI
(`.ci/run` exports EAGLE3_TARGET_CI=1) every tier must run, so there a skip is a failure, except for tests marked
`skip_ok_in_ci`: those whose condition no CI machine can meet (a CUDA GPU) or that only apply where something is
absent (an "X is not installed" message tested where X is installed).
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

IN_CI = os.environ.get("EAGLE3_TARGET_CI") == "1"


def missing(what: str, how: str) -> NoReturn:
    """Skip (fail in CI) because `what` is absent; `how` says how to get it."""
    message = f"{what} ({how})"
    if IN_CI:
        pytest.fail(f"CI runs every tier, but {message}", pytrace=False)
    pytest.skip(message)
