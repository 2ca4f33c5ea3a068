"""SGLang stays optional: nothing imports it unless asked, and asking without it fails at once, clearly."""

import importlib.util
import subprocess
import sys

import pytest
import torch
from target_support import free_port

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


@pytest.mark.skip_ok_in_ci
@pytest.mark.skipif(SGLANG_INSTALLED and torch.cuda.is_available(), reason="SGLang and a GPU are both here")
def test_serve_with_the_sglang_engine_exits_at_once_naming_what_is_missing():
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
        str(free_port()),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    # serve's checks run before the listener and the load: exit 2, one line, the first thing missing.
    assert done.returncode == 2 and "Traceback" not in done.stderr and "listening" not in done.stderr
    if not SGLANG_INSTALLED:
        assert "--engine sglang needs sglang, which is not installed: " in done.stderr
        assert "pip install 'eagle3-target[server,sglang]'" in done.stderr
    else:
        assert "--device cuda: this torch" in done.stderr and "has no usable CUDA" in done.stderr


def test_the_runner_itself_names_everything_missing():
    """Behind serve's checks, loading the runner directly still says what to install and that it needs a GPU."""
    from eagle3_target.server.runners.sglang import SGLangRunner

    with pytest.raises(Exception, match="SGLang") as raised:
        SGLangRunner.load(model="org/any-model", device="cuda")
    assert type(raised.value).__name__ == "SGLangUnavailable"
    assert (INSTALL_HINT in str(raised.value)) is not SGLANG_INSTALLED
    assert (NO_GPU in str(raised.value)) is not torch.cuda.is_available()
