import pytest
from target_support import serve

from eagle3_target.server.runners.hf import HFRunner


@pytest.fixture
async def hf_server(tiny_model_dir):
    async with serve(lambda: HFRunner.load(tiny_model_dir)) as running:
        yield running
