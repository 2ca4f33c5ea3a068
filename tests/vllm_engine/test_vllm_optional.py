"""vLLM stays optional: nothing imports it unless asked, and asking without it fails at once, clearly."""

import argparse
import subprocess
import sys

import pytest
from target_support import free_port

from eagle3_target.server.cli import add_arguments, build_loader
from eagle3_target.server.runners import load_runner
from eagle3_target.server.runners.vllm_engine import INSTALL_HINT, VLLMUnavailable, gpu_ids

from .vllm_support import VLLM_INSTALLED


def test_server_and_client_import_without_vllm():
    code = (
        "import sys\n"
        "import eagle3_target.cli, eagle3_target.server.app, eagle3_target.server.cli\n"
        "import eagle3_target.server.runners.vllm, eagle3_target.server.runners.vllm_capture\n"
        "import eagle3_target.server.runners.vllm_engine, eagle3_target.client\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'vllm'], 'vllm was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.skip_ok_in_ci
@pytest.mark.skipif(VLLM_INSTALLED, reason="vLLM is installed here")
def test_serve_with_the_vllm_engine_exits_at_once_saying_what_to_install(tmp_path):
    command = [sys.executable, "-m", "eagle3_target.cli", "serve", "--engine", "vllm"]
    command += ["--model", str(tmp_path), "--host", "127.0.0.1", "--port", str(free_port())]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "eagle3-target serve: error: --engine vllm needs vllm, which is not installed: "
        "pip install 'eagle3-target[server,vllm]' (see docs/vllm.md)"
    ]


@pytest.mark.skip_ok_in_ci
@pytest.mark.skipif(VLLM_INSTALLED, reason="vLLM is installed here")
def test_loading_the_vllm_runner_without_vllm_names_what_to_install(tmp_path):
    with pytest.raises(VLLMUnavailable) as err:
        load_runner("vllm", model=str(tmp_path), device="cpu")
    assert str(err.value) == INSTALL_HINT


@pytest.mark.parametrize(
    ("device", "tp", "expected"),
    [("cpu", 1, None), ("cuda", 1, [0]), ("cuda:2", 1, [2]), ("cuda:1", 4, [1, 2, 3, 4])],
)
def test_cuda_n_and_tensor_parallelism_pick_consecutive_gpus(device, tp, expected):
    assert gpu_ids(device, tp) == expected


def serve_loader(*flags: str):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return build_loader(parser.parse_args(["--model", "org/m", *flags]))


def test_serve_hands_the_vllm_flags_to_the_vllm_runner_only():
    loader = serve_loader(
        "--engine", "vllm", "--tensor-parallel-size", "8", "--gpu-memory-utilization", "0.8"
    )
    assert loader.args == ("vllm",)
    assert (
        loader.keywords["parallel"].tensor_parallel_size == 8
        and loader.keywords["gpu_memory_utilization"] == 0.8
    )
    assert (
        "gpu_memory_utilization" not in serve_loader("--engine", "hf", "--tensor-parallel-size", "8").keywords
    )
