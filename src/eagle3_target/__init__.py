"""eagle3-target: frozen EAGLE-3 target models as a Kubernetes-native fleet of servers.

Parts: `protocol` (shared wire contract), `server`, `client` and `operator`; `cli` is the
`eagle3-target` command.
"""

from .protocol.version import __version__

__all__ = ["__version__"]
