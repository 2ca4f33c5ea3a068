"""On Kubernetes: the example Indexed Job and the chart's precompute Job run commands our CLI accepts, one
worker per completion index, pointed at the fleet's client ConfigMap and writing to a PVC."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from chart.render import CI_VALUES, KUBE_VERSION, NAMESPACE, one, template
from tools import install_tools

from eagle3_target.client.precompute.options import WORKER_COUNT_ENV, add_arguments

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tools():
    return install_tools()


def parsed(command: list[str]) -> argparse.Namespace:
    """The container's command, parsed by precompute's own parser (a misspelt flag fails here)."""
    assert command[:2] == ["eagle3-target", "precompute"], command
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    return parser.parse_args(command[2:])


def check_job(job: dict, client_configmap: str) -> argparse.Namespace:
    kubernetes_validate.validate(job, KUBE_VERSION, strict=True)
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["parallelism"] == spec["completions"]
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # retries are the Job's, per index (backoffLimitPerIndex)
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[WORKER_COUNT_ENV] == str(spec["completions"])  # the index comes from JOB_COMPLETION_INDEX
    assert {"configMapRef": {"name": client_configmap}} in container["envFrom"]  # EAGLE3_TARGET_SERVICE
    args = parsed(container["command"])
    assert args.resume, "a retried worker must keep the shards it wrote"
    (rule,) = spec["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailIndex" and rule["onExitCodes"]["values"] == [2]  # bad input: no retry
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    output = next(path for path in mounts if args.output_dir.startswith(path + "/"))
    assert "persistentVolumeClaim" in volumes[mounts[output]], "the cache goes to a PVC"
    model = next(path for path in mounts if args.target_model.startswith(path + "/"))
    assert volumes[mounts[model]]["persistentVolumeClaim"]["readOnly"]
    return args


def test_the_example_indexed_job():
    (job,) = [
        d for d in yaml.safe_load_all((REPO / "manifests" / "example-precompute-job.yaml").read_text()) if d
    ]
    args = check_job(job, "llama-client")
    assert (args.batch_size, args.shard_size, args.metrics_port) == (4, 256, 9400)


def test_the_chart_renders_the_job_from_its_values(tools):
    values = yaml.safe_load(CI_VALUES["precompute"].read_text())
    objects = template(tools, values_file=CI_VALUES["precompute"])
    target = one(objects, "Eagle3Target")["metadata"]["name"]
    job = one(objects, "Job")
    assert job["metadata"]["namespace"] == NAMESPACE and job["spec"]["completions"] == 3
    args = check_job(job, f"{target}-client")
    assert shlex.join(job["spec"]["template"]["spec"]["containers"][0]["command"][-8:]) == shlex.join(
        values["precompute"]["args"]
    )
    assert args.target_model == values["precompute"]["targetModel"]


def test_the_chart_renders_no_job_by_default_and_refuses_one_without_a_target(tools):
    assert not [o for o in template(tools) if o["kind"] == "Job"]
    with pytest.raises(AssertionError, match="precompute.enabled needs target.enabled"):
        template(tools, {"precompute.enabled": "true", "target.enabled": "false"})
