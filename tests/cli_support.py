"""What the CLI tests share: the modules the extras bring."""

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
