"""docs/deploy.md, checked where it can be offline: the files it names exist, and its kind quickstart's
`helm install` makes a CPU fleet whose pods serve the embedded model."""

from __future__ import annotations

import argparse
import json
import re

import pytest
from chart.render import one, template
from tools import REPO, install_tools

from eagle3_target.operator import builders
from eagle3_target.operator.target_spec import TargetSpec
from eagle3_target.server import cli as serve_cli

DOC = (REPO / "docs" / "deploy.md").read_text()


def test_every_repository_path_the_guide_names_exists():
    folders = "scripts|src|docker|charts|manifests|tests|docs|\\.ci|\\.github"
    paths = set(re.findall(rf"`((?:{folders})/[\w./-]+)`", DOC))
    assert len(paths) > 10
    assert sorted(p for p in paths if not (REPO / p).exists()) == []


def quickstart_values() -> dict[str, str]:
    """The --set flags of the quickstart's helm install, as JSON values for chart.render.template."""
    command = re.search(r"helm install eagle3-target charts/eagle3-target (.*?)--wait", DOC, re.S)
    assert command, "the quickstart has no helm install"
    values = dict(re.findall(r"--set (\S+?)=(\S+)", command[1]))
    return {key: value if value.isdigit() else json.dumps(value) for key, value in values.items()}


@pytest.fixture(scope="module")
def tools():
    return install_tools()


def test_quickstart_fleet_serves_the_embedded_model_on_cpu(tools):
    values = quickstart_values()
    assert values == {
        "target.model": '"embedded-tiny-llama"',
        "target.gpusPerReplica": "0",
        "target.replicas": "2",
    }
    spec = TargetSpec.parse(one(template(tools, values), "Eagle3Target")["spec"])
    container = builders.pod_spec(spec, "eagle3-target", 0, "image")["containers"][0]
    assert container["command"] == ["eagle3-target", "serve"]
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    parser = argparse.ArgumentParser()
    serve_cli.add_arguments(parser)
    args = parser.parse_args(container["args"])
    assert (args.model, args.device, args.engine) == (None, "cpu", "hf")  # None: the embedded model
