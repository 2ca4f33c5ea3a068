"""A real Kubernetes control plane for tests, from binaries found the envtest way ($KUBEBUILDER_ASSETS: etcd,
kube-apiserver, and kube-controller-manager, kube-scheduler where present), all on 127.0.0.1 with free ports.

Like the shared tools/k8s/start-control-plane.sh (whose README says why each flag is there), plus an audit
log: every request a non-system user makes, at Metadata level, so tests can count writes and list the verbs
an identity used. The run directory has the layout start-node.sh expects (pki/ca.{crt,key},
admin.kubeconfig), so a node can join this control plane. Processes are stopped by PID.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from target_support import free_port

SERVICE_CIDR = "10.0.0.0/24"
API_SANS = [
    "127.0.0.1",
    "10.0.0.1",
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
]
SYSTEM_USERS = ["system:kube-controller-manager", "system:kube-scheduler", "system:apiserver"]
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "users": SYSTEM_USERS},
        {"level": "None", "nonResourceURLs": ["/healthz*", "/readyz*", "/livez*"]},
        {"level": "Metadata"},
    ],
}


class Pki:
    """A CA and the certificates signed by it, as PEM files in one directory."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.ca_key = self.key("ca")
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "eagle3-target-test-ca")])
        builder = self._builder(name, name, self.ca_key).add_extension(
            x509.BasicConstraints(ca=True, path_length=None), critical=True
        )
        self.ca_cert = builder.sign(self.ca_key, hashes.SHA256())
        self._write_cert("ca", self.ca_cert)

    @staticmethod
    def _builder(subject: x509.Name, issuer: x509.Name, key) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
        )

    def key(self, name: str):
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
        (self.dir / f"{name}.key").write_bytes(pem)
        return key

    def _write_cert(self, name: str, cert: x509.Certificate) -> None:
        (self.dir / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self, name: str, common_name: str, group: str | None = None, sans: list[str] | None = None
    ) -> None:
        """`name`.crt/.key: a server certificate when `sans` are given, else a client one (CN user, O group)."""
        key = self.key(name)
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if group:
            attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, group))
        builder = self._builder(x509.Name(attrs), self.ca_cert.subject, key)
        if sans:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_san(s) for s in sans]), critical=False
            )
        usage = ExtendedKeyUsageOID.SERVER_AUTH if sans else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        self._write_cert(name, builder.sign(self.ca_key, hashes.SHA256()))


def _san(text: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(text))
    except ValueError:
        return x509.DNSName(text)


def kubeconfig(server: str, ca: Path, *, user: dict, namespace: str | None = None) -> dict:
    """A kubeconfig for one user (`user`: client-certificate-data/key-data, or token)."""
    context = {"cluster": "test", "user": "test", **({"namespace": namespace} if namespace else {})}
    cluster = {"server": server, "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode()}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": cluster}],
        "users": [{"name": "test", "user": user}],
        "contexts": [{"name": "test", "context": context}],
        "current-context": "test",
    }


def _cert_user(pki: Pki, name: str) -> dict:
    return {
        "client-certificate-data": base64.b64encode((pki.dir / f"{name}.crt").read_bytes()).decode(),
        "client-key-data": base64.b64encode((pki.dir / f"{name}.key").read_bytes()).decode(),
    }


@dataclass
class ControlPlane:
    assets: Path
    run_dir: Path
    api_port: int = 0
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def ca(self) -> Path:
        return self.run_dir / "pki" / "ca.crt"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.run_dir / "admin.kubeconfig"

    @property
    def audit_log(self) -> Path:
        return self.run_dir / "audit.log"

    def write_kubeconfig(self, path: Path, *, token: str, namespace: str | None = None) -> Path:
        """A kubeconfig that carries nothing but `token` (e.g. one minted by `kubectl create token`)."""
        path.write_text(
            yaml.safe_dump(kubeconfig(self.server, self.ca, user={"token": token}, namespace=namespace))
        )
        path.chmod(0o600)
        return path

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        pki = Pki(self.run_dir / "pki")
        pki.issue("apiserver", "kube-apiserver", sans=API_SANS)
        pki.issue("admin", "admin", group="system:masters")
        pki.issue("kube-controller-manager", "system:kube-controller-manager", group="system:masters")
        pki.issue("kube-scheduler", "system:kube-scheduler")
        pki.key("service-accounts")  # signs ServiceAccount tokens (and verifies them: the public half)
        self.api_port = free_port()
        for name in ("admin", "kube-controller-manager", "kube-scheduler"):
            config = kubeconfig(self.server, self.ca, user=_cert_user(pki, name), namespace="default")
            (self.run_dir / f"{name}.kubeconfig").write_text(yaml.safe_dump(config))
        (self.run_dir / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
        try:
            self._start_etcd()
            self._start_apiserver(pki)
            self._start_controllers(pki)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, *args: str | Path) -> None:
        with open(self.run_dir / "logs" / f"{name}.log", "wb") as log:
            self.processes[name] = subprocess.Popen(
                [str(a) for a in args], stdout=log, stderr=subprocess.STDOUT
            )

    def _wait(self, what: str, ready, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    log = (self.run_dir / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"{name} exited with {proc.returncode} before {what}:\n{log}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not within {timeout} s (logs in {self.run_dir / 'logs'})")
            time.sleep(0.2)

    def _start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn(
            "etcd",
            self.assets / "etcd",
            "--name=test",
            f"--data-dir={self.run_dir / 'etcd-data'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=test=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        )
        self._wait("etcd healthy", lambda: b"true" in _get(f"{self.etcd_url}/health"))

    def _start_apiserver(self, pki: Pki) -> None:
        d = pki.dir
        self._spawn(
            "kube-apiserver",
            self.assets / "kube-apiserver",
            f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.api_port}",
            "--endpoint-reconciler-type=none",  # 127.0.0.1 in the kubernetes Endpoints fails validation
            f"--tls-cert-file={d / 'apiserver.crt'}",
            f"--tls-private-key-file={d / 'apiserver.key'}",
            f"--client-ca-file={d / 'ca.crt'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={d / 'service-accounts.key'}",
            f"--service-account-signing-key-file={d / 'service-accounts.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=RBAC",  # a missing Role rule is a real 403
            # as on OpenShift and hardened clusters: setting blockOwnerDeletion needs `update` on the owner's
            # finalizers, so the tests prove that grant
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
            "--allow-privileged=true",
            f"--cert-dir={self.run_dir / 'apiserver-certs'}",
            f"--audit-policy-file={self.run_dir / 'audit-policy.yaml'}",
            f"--audit-log-path={self.audit_log}",
            "--profiling=false",
        )
        context = ssl.create_default_context(cafile=self.ca)
        context.load_cert_chain(d / "admin.crt", d / "admin.key")
        self._wait("kube-apiserver ready", lambda: _get(f"{self.server}/readyz", context) == b"ok")

    def _start_controllers(self, pki: Pki) -> None:
        d = pki.dir
        common = ["--bind-address=127.0.0.1", "--leader-elect=false", "--profiling=false"]
        if (self.assets / "kube-controller-manager").exists():
            config = self.run_dir / "kube-controller-manager.kubeconfig"
            self._spawn(
                "kube-controller-manager",
                self.assets / "kube-controller-manager",
                f"--kubeconfig={config}",
                f"--authentication-kubeconfig={config}",
                f"--authorization-kubeconfig={config}",
                "--authentication-skip-lookup",
                f"--secure-port={free_port()}",
                "--controllers=*",  # this tree's service-CA publisher included: pods need its ConfigMap
                "--use-service-account-credentials=false",
                f"--service-account-private-key-file={d / 'service-accounts.key'}",
                f"--root-ca-file={d / 'ca.crt'}",
                f"--cluster-signing-cert-file={d / 'ca.crt'}",
                f"--cluster-signing-key-file={d / 'ca.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                *common,
            )
        if (self.assets / "kube-scheduler").exists():
            config = self.run_dir / "kube-scheduler.kubeconfig"
            self._spawn(
                "kube-scheduler",
                self.assets / "kube-scheduler",
                f"--kubeconfig={config}",
                f"--authentication-kubeconfig={config}",
                f"--authorization-kubeconfig={config}",
                "--authentication-skip-lookup",
                f"--secure-port={free_port()}",
                *common,
            )

    def stop(self) -> None:
        """Stop every process this control plane started, newest first, by PID."""
        for name, proc in reversed(list(self.processes.items())):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            del self.processes[name]

    def audit_events(self, username: str | None = None) -> list[dict]:
        """One audit event per resource request so far (a watch still open is there once it started; discovery
        and other non-resource requests are left out), optionally of one user only."""
        events: dict[str, dict] = {}
        for line in self.audit_log.read_text().splitlines():
            event = json.loads(line)
            if "objectRef" in event and username in (None, event["user"]["username"]):
                events[event["auditID"]] = event
        return list(events.values())


def _get(url: str, context: ssl.SSLContext | None = None) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return response.read()
    except OSError:
        return b""


@dataclass(frozen=True)
class Cli:
    """kubectl or helm bound to one kubeconfig; a failure raises with the tool's own message."""

    binary: Path
    config: Path

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [str(self.binary), f"--kubeconfig={self.config}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{self.binary.name} {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result

    def json(self, *args: str) -> dict:
        return json.loads(self(*args, "-o", "json").stdout)

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.config)}
