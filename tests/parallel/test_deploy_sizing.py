"""docs/deploy.md's split targets: the sizing table is bench/sizing.py's output, and the 70B Eagle3Target
example makes pods whose `serve` arguments split Llama-3.3-70B over the pod's GPUs and pass the checks."""

import argparse
import re
import subprocess
import sys

import yaml
from tools import REPO
from transformers import LlamaConfig

from eagle3_target.operator import builders
from eagle3_target.operator.target_spec import TargetSpec
from eagle3_target.server import cli as serve_cli
from eagle3_target.server.parallel import ParallelLayout
from eagle3_target.server.preflight import check_parallel

DOC = (REPO / "docs" / "deploy.md").read_text()
# Llama-3.3-70B-Instruct's config.json, the fields the checks read
LLAMA_70B = LlamaConfig(hidden_size=8192, num_attention_heads=64, num_key_value_heads=8, num_hidden_layers=80)


def test_the_sizing_table_is_what_the_script_computes():
    printed = subprocess.run(
        [sys.executable, str(REPO / "bench" / "sizing.py")], capture_output=True, text=True, check=True
    ).stdout
    assert printed.strip() in DOC


def test_the_70b_example_splits_the_model_over_the_pods_gpus():
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", DOC, re.S) if "name: llama-70b" in b]
    spec = TargetSpec.parse(yaml.safe_load(block)["spec"])
    container = builders.pod_spec(spec, "eagle3-target", 0, "image")["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    args = parser.parse_args(container["args"])
    assert (args.engine, args.device, args.tensor_parallel_size) == ("hf", "cuda", 4)
    check_parallel(args.engine, ParallelLayout.from_args(args), LLAMA_70B)
