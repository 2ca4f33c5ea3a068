"""What the CLI tests share: which commands' --help still needs their extra, and what the extras bring."""

# Commands whose argument module still imports its heavy work (being made import-light by their owners).
HELP_PENDING: set[str] = set()
# Top-level modules of the extras: with these blocked an interpreter is as good as a base install.
EXTRAS_MODULES = (
    "torch",
    "numpy",
    "aiohttp",
    "dns",
    "tqdm",
    "prometheus_client",
    "kopf",
    "kr8s",
    "yaml",
    "transformers",
)
