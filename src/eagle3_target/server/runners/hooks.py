"""The forward hooks a capture is made of, shared by the hf engine's one-device runner and its pipeline
stages: keep a module's output (or the lm_head's input), and stop the forward after the last one needed."""

from __future__ import annotations


class Stop(Exception):
    """Raised by the last hook a capture needs: the rest of the forward is not computed."""


def keep(captured: dict, key: int, stop: bool):
    """A forward hook that keeps the module's output as ``captured[key]``."""

    def hook(_module, _args, output):
        captured[key] = output[0] if isinstance(output, tuple) else output
        if stop:
            raise Stop

    return hook


def keep_input(captured: dict, stop: bool):
    """A forward pre-hook on the lm_head that keeps its input, the final normed hidden states."""

    def hook(_module, args):
        captured["final"] = args[0]
        if stop:
            raise Stop

    return hook
