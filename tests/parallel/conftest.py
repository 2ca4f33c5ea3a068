"""The split-engine tests' shared model: a tiny Llama written once per module (parallel_support.py says how)."""

import pytest
from parallel_support import write_split_llama


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(write_split_llama(tmp_path_factory.mktemp("split-llama")))
