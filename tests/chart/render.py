"""Run the real helm binary on the chart and read back what it renders."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml
from tools import REPO, Tools

CHART = REPO / "charts" / "eagle3-target"
# One Kubernetes version for `helm template --kube-version` and kubernetes-validate (which knows up to 1.37).
KUBE_VERSION = "1.34.0"

NAMESPACE = "trainers"
RELEASE = "eagle3-target"
MONITORING_APIS = tuple(
    f"monitoring.coreos.com/v1/{kind}" for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule")
)
# The value sets under ci/ (chart-testing's convention), by name: ci/<name>-values.yaml.
CI_VALUES = {
    path.name.removesuffix("-values.yaml"): path for path in sorted((CHART / "ci").glob("*-values.yaml"))
}


def helm(tools: Tools, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([str(tools.helm), *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def set_args(values: dict[str, str]) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set-json", f"{key}={value}")]


def template(
    tools: Tools,
    values: dict[str, str] | None = None,
    api_versions: tuple[str, ...] = (),
    values_file: Path | None = None,
) -> list[dict]:
    """Every object `helm template` renders (CRDs and test hooks included); values are JSON per key, applied over
    values_file."""
    args = [
        "template",
        RELEASE,
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--kube-version",
        KUBE_VERSION,
        "--include-crds",
        *(["--values", str(values_file)] if values_file else []),
        *set_args(values or {}),
    ]
    for api in api_versions:
        args += ["--api-versions", api]
    return [doc for doc in yaml.safe_load_all(helm(tools, *args).stdout) if doc]


def install_dry_run(tools: Tools, values: dict[str, str]) -> str:
    """`helm install --dry-run=client` output: the manifest and the rendered NOTES.txt."""
    args = ["install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client", *set_args(values)]
    return helm(tools, *args).stdout


def find(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {[o['metadata']['name'] for o in found]}"
    return found[0]
