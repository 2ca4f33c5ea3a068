"""A real node for the cluster tier: containerd + kubelet through the shared start-node.sh, which makes the pod
bridge, the firewall rules and the kubernetes Service mapping (its header and the shared README say why each).

Network safety, checked here and not only trusted: the node's address is the bridge's gateway (never eth0's),
and before any pod can start the chains reject forwarded traffic from the pod subnet to anywhere outside it and
host traffic to the service CIDR; at teardown they are gone. Processes stop by the PIDs the script recorded.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cluster.k8s import SERVICE_CIDR
from tiers import missing

POD_SUBNET = "10.244.0.0/24"
BRIDGE = "k8sbr0"
GATEWAY = str(next(ipaddress.ip_network(POD_SUBNET).hosts()))
FORWARD_CHAIN, OUTPUT_CHAIN = "K8SNODE-FWD", "K8SNODE-OUT"
# The API server reaches the kubelet (logs, exec) at the node's Hostname address: a name that resolves to the
# loopback kubelet on any machine.
NODE_NAME = "localhost"
# Only pods that tolerate this land on the node. A pod of another test whose image is not on the node would
# make containerd try to pull it from a registry: traffic that must never leave the machine.
TAINT = {"key": "eagle3.dev/test-node", "value": "images-imported", "effect": "NoSchedule"}
TOLERATION = {"key": TAINT["key"], "operator": "Exists", "effect": TAINT["effect"]}
NODE_PACKAGES = ".ci/node installs containerd, runc, the CNI plugins and iptables; podman: container-base.sh"


def shared_script(name: str) -> Path:
    """The shared k8s tools sit beside the checkout (../shared) or at /work/shared, as .ci/images finds them."""
    repo = Path(__file__).resolve().parents[2]
    for base in (
        os.environ.get("EAGLE3_TARGET_K8S_TOOLS"),
        repo.parent / "shared/tools/k8s",
        "/work/shared/tools/k8s",
    ):
        if base and (Path(base) / name).is_file():
            return Path(base) / name
    missing(f"the shared {name}", "set EAGLE3_TARGET_K8S_TOOLS to the folder of shared/tools/k8s")


def require_node_tools(bin_dir: Path) -> None:
    """Every tool the node needs, or one line saying what is absent."""
    if os.geteuid() != 0:
        missing("a node needs root (bridge, iptables, containerd)", "run the cluster tier as root")
    if not (bin_dir / "kubelet").is_file():
        missing(f"no kubelet in KUBEBUILDER_ASSETS={bin_dir}", "unpack shared/tools/k8s with unpack.sh")
    for tool in ("containerd", "runc", "iptables", "ip", "podman"):
        if not shutil.which(tool):
            missing(f"{tool} is not installed", NODE_PACKAGES)
    if not Path("/usr/lib/cni/bridge").is_file():
        missing("the CNI plugins are not installed", NODE_PACKAGES)


def iptables_rules(chain: str, table: str = "filter") -> list[str]:
    """The chain's rules as `iptables -S` prints them; [] when the chain does not exist."""
    done = subprocess.run(["iptables", "-t", table, "-S", chain], capture_output=True, text=True)
    return done.stdout.splitlines()[1:] if done.returncode == 0 else []


def firewall_problems() -> list[str]:
    """What is missing of the rules that keep every packet on this machine; [] when all are in place."""
    wanted = {
        FORWARD_CHAIN: f"-A {FORWARD_CHAIN} -s {POD_SUBNET} ! -d {POD_SUBNET} -j REJECT",
        OUTPUT_CHAIN: f"-A {OUTPUT_CHAIN} -d {SERVICE_CIDR} -j REJECT",
    }
    problems = []
    for chain, rule in wanted.items():
        if not any(r.startswith(rule) for r in iptables_rules(chain)):
            problems.append(f"{chain} lacks {rule!r}")
    hooks = {"FORWARD": FORWARD_CHAIN, "OUTPUT": OUTPUT_CHAIN}
    for builtin, chain in hooks.items():
        if f"-A {builtin} -j {chain}" not in iptables_rules(builtin):
            problems.append(f"{builtin} does not jump to {chain}")
    return problems


def network_left() -> list[str]:
    """Chains and bridge a node left behind (or another node on this machine owns)."""
    left = [
        c
        for c in (FORWARD_CHAIN, OUTPUT_CHAIN)
        if subprocess.run(["iptables", "-S", c], capture_output=True).returncode == 0
    ]
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode == 0:
        left.append(f"bridge {BRIDGE}")
    return left


# Chains the kubelet makes for itself (IPv4 and IPv6) and never removes: the machine is left as it was found.
KUBELET_CHAINS = {
    "filter": ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY"),
    "nat": ("KUBE-KUBELET-CANARY",),
    "mangle": ("KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"),
}


def remove_kubelet_chains() -> None:
    for tool in ("iptables", "ip6tables"):
        for table, chains in KUBELET_CHAINS.items():
            for chain in chains:
                for builtin in ("INPUT", "OUTPUT"):
                    unhook = [tool, "-t", table, "-D", builtin, "-j", chain]
                    while subprocess.run(unhook, capture_output=True).returncode == 0:
                        pass
                subprocess.run([tool, "-t", table, "-F", chain], capture_output=True)
                subprocess.run([tool, "-t", table, "-X", chain], capture_output=True)


@dataclass
class Node:
    """A running node; `stop()` ends it and removes its network."""

    script: Path
    env: dict[str, str]
    kubeconfig: str
    start_seconds: float

    def run(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run(
            ["bash", str(self.script), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, f"start-node.sh {' '.join(args)}: {done.stderr[-3000:]}"
        return done.stdout

    def import_images(self, *images: str) -> float:
        started = time.monotonic()
        self.run("import", *images, timeout=600)
        return time.monotonic() - started

    def crictl(self, *args: str) -> str:
        sock = f"unix://{self.env['NODE_DIR']}/run/containerd.sock"
        crictl = Path(self.env["K8S_BIN_DIR"]) / "crictl"
        done = subprocess.run([str(crictl), "-r", sock, "-i", sock, *args], capture_output=True, text=True)
        assert done.returncode == 0, f"crictl {' '.join(args)}: {done.stderr}"
        return done.stdout

    def stop(self) -> None:
        self.run("stop", "--wipe")
        remove_kubelet_chains()
        left = network_left()
        assert not left, f"the node's stop left {left}"


def start_node(bin_dir: Path, run_dir: Path, node_dir: Path, kubectl: str, taint: bool = True) -> Node:
    """Credentials from the control plane's CA in run_dir, then containerd + kubelet; the node is Ready and
    the firewall in place when this returns. Its clusterDNS is the gateway, where the test serves DNS.
    Untainted only on a control plane of the caller's own, where no other test's pod can land on it."""
    require_node_tools(bin_dir)
    taken = network_left()
    if taken:
        raise RuntimeError(f"another node runs on this machine ({taken}); stop it first (start-node.sh stop)")
    script = shared_script("start-node.sh")
    env = {
        **os.environ,
        "NODE_DIR": str(node_dir),
        "K8S_BIN_DIR": str(bin_dir),
        "KUBECTL": kubectl,
        "POD_SUBNET": POD_SUBNET,
        "SERVICE_CIDR": SERVICE_CIDR,
        "BRIDGE": BRIDGE,
        "CLUSTER_DNS": GATEWAY,
        "NODE_NAME": NODE_NAME,
    }
    node = Node(script, env, "", 0.0)
    node.kubeconfig = node.run("credentials", str(run_dir)).strip()
    # registered tainted before the kubelet starts, which adopts the Node object as it is
    tainted = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE_NAME},
        "spec": {"taints": [TAINT] if taint else []},
    }
    admin = ["--kubeconfig", str(run_dir / "admin.kubeconfig")]
    subprocess.run(
        [kubectl, *admin, "create", "-f", "-"],
        input=json.dumps(tainted),
        text=True,
        check=True,
        capture_output=True,
    )
    started = time.monotonic()
    try:
        node.run("start", node.kubeconfig)
    except BaseException:
        node.run("stop", "--wipe")
        raise
    node.start_seconds = time.monotonic() - started
    return node
