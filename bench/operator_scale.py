"""The operator at scale on hollow nodes: N targets of R replicas on a real control plane (tests/cluster's), the
operator run as a process with its ServiceAccount's identity, as manifests/operator.yaml runs it.

Reports the time from applying the targets to every target Ready, the status lag (a target's Ready flip after its
last pod's Ready), the operator's CPU seconds and peak RSS (VmHWM), and its API reads (get, list, watch) and writes
per minute during the ramp and over a quiet minute afterwards. Requests are counted from the API server's audit
log by the operator's ServiceAccount (every request of that identity, Lease renewals listed apart), which names
the caller exactly; the API server's request metrics carry no user.

    export KUBEBUILDER_ASSETS=$(../shared/tools/k8s/unpack.sh)
    python bench/operator_scale.py --targets 10 --replicas 2 --nodes 4      # root: hollow nodes need a bridge

Each replica asks for one GPU and each hollow node has 8: keep targets x replicas <= 8 x nodes.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]  # the cluster tier's control plane, operator process and hollow nodes

from cluster.hollow import start_hollow_nodes  # noqa: E402
from cluster.k8s import Cli, ControlPlane  # noqa: E402
from cluster.operator_process import start_operator  # noqa: E402
from tools import install_tools  # noqa: E402

READS, WRITES = {"get", "list", "watch"}, {"create", "update", "patch", "delete"}


def parse_time(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def rates(events: list[dict], start: float, end: float) -> dict[str, float]:
    """Requests per minute in [start, end): reads and writes, Lease requests apart."""
    counts: collections.Counter = collections.Counter()
    for e in events:
        at = parse_time(e["stageTimestamp"])
        if not start <= at < end:
            continue
        kind = "lease " if e["objectRef"].get("resource") == "leases" else ""
        verb = "reads" if e["verb"] in READS else "writes" if e["verb"] in WRITES else None
        if verb:
            counts[kind + verb] += 1
    minutes = max(end - start, 1e-9) / 60
    return {k: round(v / minutes, 1) for k, v in sorted(counts.items())}


def process_usage(pid: int) -> tuple[float, float]:
    """(CPU seconds, peak RSS in MB) of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    status = Path(f"/proc/{pid}/status").read_text()
    peak = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    return cpu, peak / 1024


def ready_times(kubectl: Cli, namespace: str) -> tuple[dict[str, float], dict[str, float]]:
    """Each Ready target's Ready transition, and each target's last pod Ready transition."""
    targets, pods = {}, collections.defaultdict(float)
    for item in kubectl.json("-n", namespace, "get", "eagle3targets")["items"]:
        ready = next((c for c in item.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {})
        if ready.get("status") == "True":
            targets[item["metadata"]["name"]] = parse_time(ready["lastTransitionTime"])
    for pod in kubectl.json("-n", namespace, "get", "pods")["items"]:
        ready = next((c for c in pod.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {})
        if ready.get("status") == "True":
            name = pod["metadata"]["labels"]["eagle3.dev/target"]
            pods[name] = max(pods[name], parse_time(ready["lastTransitionTime"]))
    return targets, pods


def run(args: argparse.Namespace, workdir: Path) -> None:
    assets = Path(os.environ["KUBEBUILDER_ASSETS"])
    plane = ControlPlane(assets, workdir / "control-plane")
    plane.start()
    kubectl = Cli(
        assets / "kubectl" if (assets / "kubectl").is_file() else install_tools().kubectl,
        plane.admin_kubeconfig,
    )
    nodes = None
    try:
        kubectl("apply", "--server-side", "-f", str(REPO / "manifests" / "crd.yaml"))
        kubectl("wait", "--for=condition=Established", "crd/eagle3targets.eagle3.dev")
        kubectl(
            "apply",
            "-f",
            str(REPO / "manifests" / "namespace.yaml"),
            "-f",
            str(REPO / "manifests" / "rbac.yaml"),
        )
        nodes = start_hollow_nodes(plane, kubectl, assets, workdir / "hollow", args.nodes)
        operator = start_operator(
            plane,
            kubectl,
            workdir,
            "--all-namespaces",
            namespace="eagle3-system",
            service_account="eagle3-target-operator",
        )
        kubectl("create", "namespace", "fleet")
        time.sleep(5)  # the operator's startup listings stay out of the ramp
        spec = {
            "model": "m",
            "image": "example.test/server:1",
            "replicas": args.replicas,
            "gpusPerReplica": 1,
            "nodeSelector": {"eagle3.dev/hollow": "true"},
        }
        docs = [
            {
                "apiVersion": "eagle3.dev/v1alpha1",
                "kind": "Eagle3Target",
                "metadata": {"name": f"t{i}", "namespace": "fleet"},
                "spec": spec,
            }
            for i in range(args.targets)
        ]
        start = time.time()
        kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(docs))
        while True:
            targets, pods = ready_times(kubectl, "fleet")
            if len(targets) == args.targets:
                break
            if time.time() - start > args.timeout:
                raise SystemExit(f"only {len(targets)}/{args.targets} targets Ready after {args.timeout} s")
            time.sleep(1)
        ramp_end = time.time()
        lag = [targets[t] - pods[t] for t in targets]
        cpu, peak = process_usage(operator.proc.pid)
        time.sleep(args.quiet)
        quiet_end = time.time()
        events = plane.audit_events(operator.user)
        print(f"{args.targets} targets x {args.replicas} replicas on {args.nodes} hollow nodes")
        print(
            f"  all Ready after {max(targets.values()) - start:.1f} s (last pod Ready after {max(pods.values()) - start:.1f} s)"
        )
        print(f"  status lag: max {max(lag):.1f} s, median {sorted(lag)[len(lag) // 2]:.1f} s")
        print(f"  operator: {cpu:.1f} CPU s through the ramp, peak RSS {peak:.0f} MB")
        print(f"  per minute during the ramp: {rates(events, start, ramp_end)}")
        print(f"  per minute over {args.quiet:.0f} s quiet: {rates(events, ramp_end + 5, quiet_end)}")
        operator.stop()
    finally:
        if nodes is not None:
            nodes.stop()
        plane.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", type=int, default=10)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--nodes", type=int, default=4, help="hollow nodes (8 GPUs, about 80 MB each)")
    p.add_argument("--quiet", type=float, default=60.0, help="seconds to count requests once all is Ready")
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="operator-scale-") as workdir:
        run(args, Path(workdir))


if __name__ == "__main__":
    main()
