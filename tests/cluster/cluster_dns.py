"""Cluster DNS for the test cluster, which has none: a dnslib server answering the cluster zone from the real API.

It plays CoreDNS's kubernetes plugin for what the project uses, built from the live Services and EndpointSlices
(polled, so it follows what the endpoint-slice controller publishes, with its delays):
  <svc>.<ns>.svc.<zone>                   A: a headless Service's ready endpoints; a ClusterIP Service's IP
  <hostname>.<svc>.<ns>.svc.<zone>        A: the endpoint with that hostname (pods with hostname + subdomain)
  _<port>._<proto>.<svc>.<ns>.svc.<zone>  SRV: one per ready endpoint, its own port, its hostname's name
Other names in the zone are NXDOMAIN; names outside it are REFUSED: nothing is forwarded anywhere.
It listens on loopback for the test's own client and on the pod bridge's gateway, the node's clusterDNS, for pods.
"""

from __future__ import annotations

import contextlib
import errno
import threading
import time

import dns.resolver
import kr8s
from dnslib import QTYPE, RCODE, RR, SRV, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer

ZONE = "cluster.local"
TTL = 1  # the test's client re-resolves on a timer; a short TTL keeps pods from caching a dead endpoint


def _ready(endpoint: dict) -> bool:
    # the controller marks every endpoint ready when the Service publishes not-ready addresses
    return endpoint.get("conditions", {}).get("ready") is not False


def records_from(services: list[dict], slices: list[dict], zone: str = ZONE) -> dict[tuple[str, str], list]:
    """(name with final dot, "A"/"SRV") -> rdata, for the given Services and EndpointSlices."""
    records: dict[tuple[str, str], list] = {}

    def add(name: str, kind: str, rdata) -> None:
        records.setdefault((name + ".", kind), []).append(rdata)

    headless = set()
    for svc in services:
        meta, spec = svc["metadata"], svc["spec"]
        fqdn = f"{meta['name']}.{meta['namespace']}.svc.{zone}"
        if spec.get("clusterIP") in (None, "None"):
            headless.add((meta["namespace"], meta["name"]))
            records.setdefault((fqdn + ".", "A"), [])  # the name exists with no ready pod
        else:
            add(fqdn, "A", A(spec["clusterIP"]))
    for slice_ in slices:
        meta = slice_["metadata"]
        service = (meta.get("labels") or {}).get("kubernetes.io/service-name")
        if (meta["namespace"], service) not in headless or slice_.get("addressType") != "IPv4":
            continue
        fqdn = f"{service}.{meta['namespace']}.svc.{zone}"
        for endpoint in slice_.get("endpoints") or ():
            if not _ready(endpoint):
                continue
            ip = endpoint["addresses"][0]
            host = f"{endpoint.get('hostname') or ip.replace('.', '-')}.{fqdn}"
            add(fqdn, "A", A(ip))
            add(host, "A", A(ip))
            for port in slice_.get("ports") or ():
                if port.get("name"):
                    srv_name = f"_{port['name']}._{port.get('protocol', 'TCP').lower()}.{fqdn}"
                    add(srv_name, "SRV", SRV(0, 100, port["port"], host + "."))
    return records


class EndpointSliceDNS(BaseResolver):
    """Answers from records rebuilt every `interval` seconds from the API server."""

    def __init__(self, kubeconfig: str, interval: float = 0.25, zone: str = ZONE):
        self.api = kr8s.api(kubeconfig=kubeconfig)
        self.interval, self.zone = interval, zone
        self.records: dict[tuple[str, str], list] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.refreshed = threading.Event()

    def refresh(self) -> None:
        services = [s.raw for s in self.api.get("services", namespace=kr8s.ALL)]
        slices = [s.raw for s in self.api.get("endpointslices", namespace=kr8s.ALL)]
        records = records_from(services, slices, self.zone)
        with self.lock:
            self.records = records
        self.refreshed.set()

    def poll(self) -> None:
        while not self.stop.wait(self.interval):
            with contextlib.suppress(Exception):  # an API hiccup keeps the last answers, as CoreDNS does
                self.refresh()

    def lookup(self, name: str, kind: str) -> list:
        with self.lock:
            return list(self.records.get((name, kind), ()))

    def resolve(self, request, handler):
        reply = request.reply()
        qname, qtype = str(request.q.qname).lower(), QTYPE[request.q.qtype]
        if not qname.rstrip(".").endswith("." + self.zone):
            reply.header.rcode = RCODE.REFUSED
            return reply
        with self.lock:
            known = any(key[0] == qname for key in self.records)
            rdatas = list(self.records.get((qname, qtype), ()))
        for rdata in rdatas:
            reply.add_answer(RR(qname, getattr(QTYPE, qtype), rdata=rdata, ttl=TTL))
        if not known:
            reply.header.rcode = RCODE.NXDOMAIN
        return reply


@contextlib.contextmanager
def cluster_dns(kubeconfig: str, pod_listen: str, loopback_port: int = 0):
    """The DNS server on 127.0.0.1 (any free port, UDP+TCP) and on `pod_listen`:53 (UDP+TCP). Yields
    (resolver, "127.0.0.1:port") for eagle3_target's make_resolver."""
    resolver = EndpointSliceDNS(kubeconfig)
    resolver.refresh()
    quiet = DNSLogger(log="-request,-reply,-truncated,-error,-recv,-send,-data")
    servers = [
        *loopback_pair(resolver, quiet, loopback_port),
        DNSServer(resolver, address=pod_listen, port=53, logger=quiet),
        DNSServer(resolver, address=pod_listen, port=53, tcp=True, logger=quiet),
    ]
    for server in servers:
        server.start_thread()
    poller = threading.Thread(target=resolver.poll, name="cluster-dns-poll", daemon=True)
    poller.start()
    try:
        yield resolver, f"127.0.0.1:{servers[0].server.server_address[1]}"
    finally:
        resolver.stop.set()
        poller.join(5)
        for server in servers:
            server.stop()
            server.server.server_close()


def loopback_pair(resolver, quiet, port: int, tries: int = 20) -> list:
    """A UDP and a TCP DNSServer on one port of 127.0.0.1 (``port``, or any free one). A port free for UDP
    can be some other process's ephemeral TCP port (a cluster's components open connections all the time):
    then another port is tried."""
    for _ in range(tries):
        udp = DNSServer(resolver, address="127.0.0.1", port=port, logger=quiet)
        try:
            tcp_port = udp.server.server_address[1]
            return [udp, DNSServer(resolver, address="127.0.0.1", port=tcp_port, tcp=True, logger=quiet)]
        except OSError as exc:
            udp.server.server_close()
            if exc.errno != errno.EADDRINUSE or port:
                raise
    raise OSError(errno.EADDRINUSE, f"no port of 127.0.0.1 free for both UDP and TCP in {tries} tries")


def wait_for_answer(nameserver: str, name: str, kind: str, count: int, timeout: float = 60) -> list:
    """Ask `nameserver` ("127.0.0.1:port") over UDP until `name` has `count` records of `kind`; the records."""
    host, port = nameserver.rsplit(":", 1)
    resolver = dns.resolver.Resolver(configure=False)
    resolver.nameservers, resolver.port, resolver.lifetime = [host], int(port), 2
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = list(resolver.resolve(name, kind))
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            found = []
        if len(found) == count:
            return found
        assert time.monotonic() < deadline, f"{name} {kind}: {len(found)} records, expected {count}"
        time.sleep(0.2)
