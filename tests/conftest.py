import pytest

from eagle3_target.server.runners.tiny import build_tiny_llama


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny random Llama, saved with save_pretrained, as a real model directory."""
    path = tmp_path_factory.mktemp("tiny-llama")
    build_tiny_llama(seed=1).save_pretrained(path)
    return str(path)
