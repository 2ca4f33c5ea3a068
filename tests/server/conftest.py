import pytest

from eagle3_target.server.runners.hf import HFRunner
from target_support import serve


@pytest.fixture
async def hf_server(tiny_model_dir):
    async with serve(lambda: HFRunner.load(tiny_model_dir)) as running:
        yield running
