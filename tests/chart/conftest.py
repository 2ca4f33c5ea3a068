"""Fixtures of the chart tests: real helm and kubectl binaries (see tests/tools.py)."""

import pytest
from tools import Tools, install_tools


@pytest.fixture(scope="session")
def tools() -> Tools:
    return install_tools()
