"""Where the target servers are: an endpoint spec, resolved to base URLs.

Spec forms (comma-separated specs are merged):
  http://10.0.0.5:8001                   one server, as given
  http://[fd00::5]:8001                  an IPv6 literal, in brackets
  dns://<service>[:port]                 A and AAAA records of a headless Service; one port for all pods (default 8001)
  srv://_<port-name>._tcp.<service>      SRV records; each pod brings its own port (hostNetwork)
Names resolve to IPv4 and IPv6 addresses alike, so IPv6-only and dual-stack clusters work; URLs bracket IPv6.
Kubernetes DNS changes slowly (TTL plus cache), so callers re-resolve on a timer and after errors.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from dataclasses import dataclass
from urllib.parse import urlsplit

import dns.asyncresolver
import dns.exception
import dns.resolver

from eagle3_target.protocol import contract
from eagle3_target.protocol.contract import DEFAULT_PORT, SERVICE_ENV

from .addresses import AddressFilter
from .options import PoolOptions

log = logging.getLogger(__name__)

DNS_ERRORS = (dns.exception.DNSException,)


class EndpointError(RuntimeError):
    """A spec that cannot be parsed, or a name that did not resolve in time."""


@dataclass(frozen=True)
class EndpointSpec:
    kind: str  # "http", "dns" or "srv"
    name: str  # a base URL for http, a DNS name otherwise
    port: int = DEFAULT_PORT

    def __str__(self) -> str:
        if self.kind == "http":
            return self.name
        return f"{self.kind}://{self.name}" + (f":{self.port}" if self.kind == "dns" else "")


def parse_specs(text: str) -> list[EndpointSpec]:
    """Parse a comma-separated endpoint spec; raise EndpointError naming the bad part."""
    specs = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        scheme, sep, rest = part.partition("://")
        if not sep and bare_address(part):
            scheme, sep, rest = "http", "://", part
            part = "http://" + part  # a bare host:port is a server's address, as probe and curl take it
        if not sep or not rest:
            raise EndpointError(
                f"endpoint {part!r} has no scheme; use http://host:port, dns://name[:port] or srv://name"
            )
        scheme = scheme.lower()
        if scheme in ("http", "https"):
            specs.append(EndpointSpec("http", part.rstrip("/")))
        elif scheme == "dns":
            url = urlsplit("//" + rest)
            try:
                port = url.port or DEFAULT_PORT
            except ValueError:
                raise EndpointError(f"endpoint {part!r} has a bad port") from None
            if not url.hostname:
                raise EndpointError(f"endpoint {part!r} names no service")
            specs.append(EndpointSpec("dns", url.hostname, port))
        elif scheme == "srv":
            if ":" in rest or "/" in rest:
                raise EndpointError(f"endpoint {part!r}: SRV records carry the ports, give only the name")
            specs.append(EndpointSpec("srv", rest))
        else:
            raise EndpointError(f"endpoint {part!r}: unknown scheme {scheme!r}; use http, dns or srv")
    if not specs:
        raise EndpointError("no endpoints given")
    return specs


def bare_address(text: str) -> bool:
    """``host:port`` with nothing else (``[v6]:port`` too): what a user means as an http:// server."""
    url = urlsplit("//" + text)
    try:
        return bool(url.hostname and url.port) and not (url.path or url.query or url.fragment)
    except ValueError:
        return False


def default_spec() -> str:
    """The endpoint spec the operator injects into trainer pods."""
    text = os.environ.get(SERVICE_ENV, "").strip()
    if not text:
        raise EndpointError(f"no endpoints given and ${SERVICE_ENV} is not set")
    return text


def read_auth_token(path: str | os.PathLike | None = None) -> str | None:
    """The bearer token in ``path``, else in the file $EAGLE3_TARGET_AUTH_TOKEN_FILE names; None when neither
    names one. An empty or unreadable file is an EndpointError (contract.read_token_file's rule)."""
    try:
        return contract.read_token_file(path) if path else contract.token_from_env()
    except contract.TokenFileError as exc:
        raise EndpointError(str(exc)) from None


def base_url(ip: str, port: int) -> str:
    """http://ip:port, with an IPv6 address in brackets (RFC 3986)."""
    return f"http://[{ip}]:{port}" if ":" in ip else f"http://{ip}:{port}"


def _nameserver(text: str) -> tuple[str, str]:
    """``host``, ``host:port``, ``ipv6`` or ``[ipv6]:port`` -> (host, port or "")."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, rest.removeprefix(":")
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, port
    return text, ""


def make_resolver(nameserver: str | None = None, timeout: float = 2.0) -> dns.asyncresolver.Resolver:
    """The system's resolver, or one that asks only ``host[:port]`` (tests point this at a local server)."""
    if nameserver is None:
        try:
            resolver = dns.asyncresolver.Resolver()
        except dns.resolver.NoResolverConfiguration:  # http:// endpoints need none; EndpointResolver says so
            resolver = dns.asyncresolver.Resolver(configure=False)
    else:
        host, port = _nameserver(nameserver)
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [host]
        resolver.port = int(port) if port else 53
    resolver.lifetime = timeout
    resolver.cache = None  # our own timer decides when to look again
    return resolver


class EndpointResolver:
    """Turns specs into a sorted list of base URLs, one DNS round per call. Every address is checked
    (addresses.py) and each name yields at most ``max_endpoints``; an SRV name's targets are resolved
    ``RESOLVE_CONCURRENCY`` at a time, so a name with thousands of records still resolves in bounded time."""

    RESOLVE_CONCURRENCY = 32

    def __init__(
        self,
        specs: list[EndpointSpec],
        resolver: dns.asyncresolver.Resolver | None = None,
        max_endpoints: int = 256,
    ):
        self.specs = specs
        self.resolver = resolver or make_resolver()
        self.filter = AddressFilter(max_endpoints)
        named = [str(s) for s in specs if s.kind != "http"]
        if named and not self.resolver.nameservers:
            raise EndpointError(
                f"no DNS server to resolve {', '.join(named)}: /etc/resolv.conf names none; "
                "pass --nameserver HOST[:PORT] or http:// endpoints"
            )

    async def resolve(self) -> list[str]:
        """All URLs now; raises a DNS error if any name does not resolve."""
        urls: set[str] = set()
        for spec in self.specs:
            if spec.kind == "http":
                urls.add(spec.name)
            elif spec.kind == "dns":
                found = [
                    ip
                    for ip in await self._addresses(spec.name)
                    if self.filter.keep(spec.name, ip, spec.port)
                ]
                urls.update(self.filter.cap(spec.name, sorted(base_url(ip, spec.port) for ip in found)))
            else:
                urls.update(await self._srv(spec.name))
        return sorted(urls)

    async def _srv(self, name: str) -> list[str]:
        """The URLs an SRV name's records point at, at most ``max_endpoints``; a target that does not
        resolve adds nothing (the name raises only when none does)."""
        answer = await self.resolver.resolve(name, "SRV")
        records = sorted({(r.target.to_text(omit_final_dot=True), r.port) for r in answer})
        records = self.filter.cap(
            name, [(t, p) for t, p in records if p != 0 or self.filter.keep(name, t, p)]
        )
        gate = asyncio.Semaphore(self.RESOLVE_CONCURRENCY)

        async def urls_of(target: str, port: int) -> list[str]:
            async with gate:
                ips = await self._addresses(target)
            return [base_url(ip, port) for ip in ips if self.filter.keep(name, ip, port)]

        found = await asyncio.gather(*(urls_of(t, p) for t, p in records), return_exceptions=True)
        errors = [r for r in found if isinstance(r, BaseException)]
        if errors and len(errors) == len(found):
            raise errors[0]
        return self.filter.cap(
            name, sorted({u for r in found if not isinstance(r, BaseException) for u in r})
        )

    async def _addresses(self, name: str) -> list[str]:
        """IPv4 and IPv6 addresses of ``name``; a family the name lacks answers NoAnswer and adds nothing. Raises
        if neither family has an address, or on any other DNS error (NXDOMAIN, timeout)."""
        answers = await asyncio.gather(
            *(self.resolver.resolve(name, rdtype) for rdtype in ("A", "AAAA")), return_exceptions=True
        )
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, dns.resolver.NoAnswer):
                raise answer
        found = [r.address for a in answers if not isinstance(a, BaseException) for r in a]
        if not found:
            raise answers[0]
        return found

    async def resolve_until(
        self,
        deadline: float,
        first_delay: float = 0.2,
        max_delay: float = 5.0,
        options: PoolOptions | None = None,
    ) -> list[str]:
        """Retry with bounded, jittered backoff until some URL resolves or ``deadline`` (loop time) passes,
        warning on the schedule of ``options`` (PoolOptions' defaults) which names do not resolve and why."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        warn = (options or PoolOptions()).wait_warnings(started)
        delay = first_delay
        names = ", ".join(str(s) for s in self.specs)
        while True:
            try:
                urls = await self.resolve()
                if urls:
                    return urls
                problem = "resolved to no addresses"
            except DNS_ERRORS as exc:
                problem = f"{type(exc).__name__}: {exc}"
            now = loop.time()
            if now >= deadline:
                raise EndpointError(
                    f"target endpoints {names} did not resolve in time; last error: {problem}"
                )
            if warn.due(now):
                log.warning(
                    "target endpoints %s do not resolve after %.0fs: %s", names, now - started, problem
                )
            # no later than the next warning, so it comes on time whatever the backoff
            await asyncio.sleep(min(min(deadline, warn.at) - now, delay * random.uniform(0.5, 1.0)))
            delay = min(max_delay, delay * 2)
