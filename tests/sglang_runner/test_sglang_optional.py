"""SGLang stays optional: nothing imports it unless asked, and asking without it fails at once, clearly."""

import importlib.util
import subprocess
import sys

import pytest
import torch

from eagle3_target.server.runners.sglang import INSTALL_HINT, NO_GPU

SGLANG_INSTALLED = importlib.util.find_spec("sglang") is not None


def test_server_and_client_import_without_sglang():
    code = (
        "import sys\n"
        "import eagle3_target.cli, eagle3_target.server.app, eagle3_target.server.cli\n"
        "import eagle3_target.server.runners.sglang, eagle3_target.client\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'sglang'], 'sglang was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.skipif(SGLANG_INSTALLED and torch.cuda.is_available(), reason="SGLang and a GPU are both here")
def test_serve_with_the_sglang_engine_exits_nonzero_naming_what_is_missing():
    command = [
        sys.executable,
        "-m",
        "eagle3_target.cli",
        "serve",
        "--engine",
        "sglang",
        "--device",
        "cuda",
        "--model",
        "org/any-model",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert (INSTALL_HINT in done.stderr) is not SGLANG_INSTALLED
    assert (NO_GPU in done.stderr) is not torch.cuda.is_available()
    assert "SGLangUnavailable" in done.stderr
