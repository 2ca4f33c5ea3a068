"""vLLM stays optional: nothing imports it unless asked, and asking without it fails at once, clearly."""

import subprocess
import sys

import pytest

from eagle3_target.server.runners.vllm import INSTALL_HINT, visible_devices

from .vllm_support import VLLM_INSTALLED


def test_server_and_client_import_without_vllm():
    code = (
        "import sys\n"
        "import eagle3_target.cli, eagle3_target.server.app, eagle3_target.server.cli\n"
        "import eagle3_target.server.runners.vllm, eagle3_target.client\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'vllm'], 'vllm was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.skipif(VLLM_INSTALLED, reason="vLLM is installed here")
def test_serve_with_the_vllm_engine_exits_nonzero_saying_what_to_install(tmp_path):
    command = [sys.executable, "-m", "eagle3_target.cli", "serve", "--engine", "vllm"]
    command += ["--model", str(tmp_path), "--host", "127.0.0.1", "--port", "0"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert f"VLLMUnavailable: {INSTALL_HINT}" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("device", "tp", "visible", "expected"),
    [
        ("cpu", 1, None, None),
        ("cuda", 1, None, "0"),
        ("cuda:2", 1, None, "2"),
        ("cuda:1", 2, None, "1,2"),
        ("cuda:1", 2, "4,5,6,7", "5,6"),
    ],
)
def test_the_chosen_gpus_become_the_visible_ones(device, tp, visible, expected):
    assert visible_devices(device, tp, visible) == expected


def test_more_gpus_than_visible_is_refused():
    with pytest.raises(ValueError, match="only 2 are visible"):
        visible_devices("cuda:1", 2, "4,5")
