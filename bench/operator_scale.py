"""The operator at scale on hollow nodes: N targets of R replicas on a real control plane (tests/cluster's), the
operator run as a process with its ServiceAccount's identity, as manifests/operator.yaml runs it.

Reports the time from applying the targets to every target Ready, the status lag (a target's Ready flip after its
last pod's Ready), the operator's CPU seconds and peak RSS (VmHWM), and its API reads (get, list, watch) and writes
per minute during the ramp and over a quiet minute afterwards. Requests are counted the way a cluster admin can:
three API Priority and Fairness FlowSchemas match the operator's ServiceAccount (Leases; reads: get, list, watch;
writes: every other verb), and the API server's `apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}`
on /metrics counts each one (the request metrics themselves carry no user). The metric carries no verb, hence one
FlowSchema per kind of request; the Lease schema takes precedence, so renewals stay out of reads and writes.

    export KUBEBUILDER_ASSETS=$(../shared/tools/k8s/unpack.sh)
    python bench/operator_scale.py --targets 10 --replicas 2 --nodes 4      # root: hollow nodes need a bridge
    python bench/operator_scale.py --targets 100 --replicas 8 --nodes 20 --gpus 0

Each replica asks for --gpus GPUs (default 1) and each hollow node has 8: keep targets x replicas x gpus <= 8 x nodes.
A hollow kubelet takes at most 110 pods.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import os
import re
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

READ_VERBS = ["get", "list", "watch"]
WRITE_VERBS = ["create", "update", "patch", "delete", "deletecollection"]
# FlowSchema name -> (precedence, resource rule); a lower precedence is matched first.
FLOW_SCHEMAS = {
    "e3t-operator-leases": (
        400,
        {"verbs": ["*"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"]},
    ),
    "e3t-operator-reads": (410, {"verbs": READ_VERBS, "apiGroups": ["*"], "resources": ["*"]}),
    "e3t-operator-writes": (420, {"verbs": WRITE_VERBS, "apiGroups": ["*"], "resources": ["*"]}),
}
METRIC = re.compile(r"^apiserver_flowcontrol_dispatched_requests_total\{([^}]*)\} (\S+)$", re.M)


def flow_schemas(namespace: str, service_account: str) -> list[dict]:
    """The FlowSchemas that count one ServiceAccount's requests (all in workload-low, where a ServiceAccount's
    requests go by default, so counting does not change how the API server queues them)."""
    subject = {"kind": "ServiceAccount", "serviceAccount": {"name": service_account, "namespace": namespace}}
    return [
        {
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "FlowSchema",
            "metadata": {"name": name},
            "spec": {
                "priorityLevelConfiguration": {"name": "workload-low"},
                "matchingPrecedence": precedence,
                "distinguisherMethod": {"type": "ByUser"},
                "rules": [
                    {
                        "subjects": [subject],
                        "resourceRules": [{**rule, "namespaces": ["*"], "clusterScope": True}],
                        **(
                            {"nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": ["*"]}]}
                            if "reads" in name
                            else {}
                        ),
                    }
                ],
            },
        }
        for name, (precedence, rule) in FLOW_SCHEMAS.items()
    ]


def dispatched(kubectl: Cli) -> dict[str, float]:
    """apiserver_flowcontrol_dispatched_requests_total of each of FLOW_SCHEMAS, read from the API server's /metrics."""
    counts = dict.fromkeys(FLOW_SCHEMAS, 0.0)
    for labels, value in METRIC.findall(kubectl("get", "--raw", "/metrics").stdout):
        schema = re.search(r'flow_schema="([^"]*)"', labels).group(1)
        if schema in counts:
            counts[schema] += float(value)
    return counts


def parse_time(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def rates(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Requests per minute between two readings of dispatched(): reads, writes and Lease requests."""
    minutes = max(seconds, 1e-9) / 60
    names = {"e3t-operator-reads": "reads", "e3t-operator-writes": "writes", "e3t-operator-leases": "lease"}
    return {names[k]: round((after[k] - before[k]) / minutes, 1) for k in FLOW_SCHEMAS}


def process_usage(pid: int) -> tuple[float, float]:
    """(CPU seconds, peak RSS in MB) of a live process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    status = Path(f"/proc/{pid}/status").read_text()
    peak = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:"))
    return cpu, peak / 1024


def ready_at(items: list[dict]) -> dict[str, float]:
    """Each Ready object's Ready transition time, by name."""
    times = {}
    for item in items:
        ready = next((c for c in item.get("status", {}).get("conditions", []) if c["type"] == "Ready"), {})
        if ready.get("status") == "True":
            times[item["metadata"]["name"]] = parse_time(ready["lastTransitionTime"])
    return times


def last_pod_ready(kubectl: Cli, namespace: str) -> dict[str, float]:
    """Each target's last pod Ready transition."""
    pods = kubectl.json("-n", namespace, "get", "pods")["items"]
    target_of = {p["metadata"]["name"]: p["metadata"]["labels"]["eagle3.dev/target"] for p in pods}
    last: dict[str, float] = collections.defaultdict(float)
    for name, at in ready_at(pods).items():
        last[target_of[name]] = max(last[target_of[name]], at)
    return last


def install_manifests(kubectl: Cli) -> None:
    """The CRD, the namespace and RBAC, and flow schemas that keep the operator's requests apart."""
    kubectl("apply", "--server-side", "-f", str(REPO / "manifests" / "crd.yaml"))
    kubectl("wait", "--for=condition=Established", "crd/eagle3targets.eagle3.dev")
    kubectl(
        "apply",
        "-f",
        str(REPO / "manifests" / "namespace.yaml"),
        "-f",
        str(REPO / "manifests" / "rbac.yaml"),
    )
    kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump_all(flow_schemas("eagle3-system", "eagle3-target-operator")),
    )


def target_docs(args: argparse.Namespace) -> list[dict]:
    """``--targets`` Eagle3Targets on the hollow nodes."""
    spec = {
        "model": "m",
        "image": "example.test/server:1",
        "replicas": args.replicas,
        "gpusPerReplica": args.gpus,
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
    return docs


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
        install_manifests(kubectl)
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
        start, counted = time.time(), dispatched(kubectl)
        kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(target_docs(args)))
        while (
            len(targets := ready_at(kubectl.json("-n", "fleet", "get", "eagle3targets")["items"]))
            < args.targets
        ):
            if time.time() - start > args.timeout:
                raise SystemExit(f"only {len(targets)}/{args.targets} targets Ready after {args.timeout} s")
            time.sleep(2)
        ramp_end, at_ramp_end = time.time(), dispatched(kubectl)
        pods = last_pod_ready(kubectl, "fleet")
        lag = [targets[t] - pods[t] for t in targets]
        cpu, peak = process_usage(operator.proc.pid)
        time.sleep(5)  # events of the last transitions stay out of the quiet minute
        quiet_start, at_quiet_start = time.time(), dispatched(kubectl)
        time.sleep(args.quiet)
        quiet_end, at_quiet_end = time.time(), dispatched(kubectl)
        cpu_quiet = process_usage(operator.proc.pid)[0] - cpu
        print(
            f"{args.targets} targets x {args.replicas} replicas ({args.gpus} GPU each) on {args.nodes} hollow nodes"
        )
        print(
            f"  all Ready after {max(targets.values()) - start:.1f} s (last pod Ready after {max(pods.values()) - start:.1f} s)"
        )
        print(f"  status lag: max {max(lag):.1f} s, median {sorted(lag)[len(lag) // 2]:.1f} s")
        print(
            f"  operator: {cpu:.1f} CPU s through the ramp, peak RSS {peak:.0f} MB, {cpu_quiet:.1f} CPU s quiet"
        )
        print(f"  per minute during the ramp: {rates(counted, at_ramp_end, ramp_end - start)}")
        print(
            f"  per minute over {args.quiet:.0f} s quiet: {rates(at_quiet_start, at_quiet_end, quiet_end - quiet_start)}"
        )
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
    p.add_argument(
        "--gpus", type=int, default=1, help="gpusPerReplica (0: pods bound only by the 110-pod limit)"
    )
    p.add_argument("--quiet", type=float, default=60.0, help="seconds to count requests once all is Ready")
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="operator-scale-") as workdir:
        run(args, Path(workdir))


if __name__ == "__main__":
    main()
