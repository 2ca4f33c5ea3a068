"""NeMo's names, imported with an error that says what to install."""

from __future__ import annotations

import importlib
import importlib.util

INSTALL_HINT = (
    "pip install 'eagle3-target[nemo]' (beside an existing torch: "
    "pip install --no-deps nemo-automodel==0.7.0 torchao==0.18.0 torchdata==0.11.0)"
)


def nemo_module(name: str):
    """Import ``nemo_automodel.<name>``; without NeMo AutoModel (or its training dependencies)
    raise an ImportError naming the install command."""
    try:
        return importlib.import_module(f"nemo_automodel.{name}")
    except ImportError as exc:
        raise ImportError(
            f"eagle3_target.client.nemo needs NVIDIA NeMo AutoModel ({exc}); install it: {INSTALL_HINT}"
        ) from exc


def require_nemo() -> None:
    """The same ImportError where NeMo AutoModel is not installed, found without importing it (NeMo's own
    modules import torch, and the families' registry must stay light)."""
    try:
        found = importlib.util.find_spec("nemo_automodel") is not None
    except (ImportError, ValueError):  # a module blocked in sys.modules, or one without a spec
        found = False
    if not found:
        raise ImportError(
            "eagle3_target.client.nemo needs NVIDIA NeMo AutoModel (no module named 'nemo_automodel'); "
            f"install it: {INSTALL_HINT}"
        )
