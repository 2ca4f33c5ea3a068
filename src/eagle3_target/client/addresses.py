"""Which DNS answers may become target endpoints: the fleet's DNS is an input like any reply.

An address that cannot be a target pod (unspecified, link-local such as the cloud metadata service
169.254.169.254, multicast, broadcast, in any spelling including IPv4-mapped IPv6) or a port 0 is
dropped with one warning each, and one name yields at most ``max_endpoints`` of them.
"""

from __future__ import annotations

import ipaddress
import logging

log = logging.getLogger(__name__)

BROADCAST = ipaddress.IPv4Address("255.255.255.255")


def problem(ip: str, port: int) -> str | None:
    """Why ``ip``:``port`` cannot be a target endpoint; None when it can."""
    if port == 0:
        return "port 0"
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return "not an IP address"
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    for kind in ("unspecified", "link_local", "multicast"):
        if getattr(address, f"is_{kind}"):
            return f"a {kind.replace('_', '-')} address"
    if address == BROADCAST:
        return "the broadcast address"
    return None


class AddressFilter:
    """Drops what ``problem`` names and caps each name's endpoints, warning once per address and name."""

    def __init__(self, max_endpoints: int = 256):
        if max_endpoints < 1:
            raise ValueError("max_endpoints must be at least 1")
        self.max_endpoints = max_endpoints
        self._warned: set[tuple[str, ...]] = set()

    def keep(self, name: str, ip: str, port: int) -> bool:
        why = problem(ip, port)
        if why is not None:
            self._warn_once(("drop", name, ip, str(port)), "ignoring %s:%s from %s: %s", ip, port, name, why)
        return why is None

    def cap(self, name: str, items: list) -> list:
        """The first ``max_endpoints`` of ``items`` (sorted, so every refresh takes the same ones)."""
        if len(items) > self.max_endpoints:
            self._warn_once(
                ("cap", name),
                "%s names %d endpoints; taking the first %d (max_endpoints)",
                name,
                len(items),
                self.max_endpoints,
            )
        return items[: self.max_endpoints]

    def _warn_once(self, key: tuple[str, ...], message: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message, *args)
