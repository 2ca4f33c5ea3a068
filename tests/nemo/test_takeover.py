"""The setup-time swap of a NeMo recipe module's target loader (client/nemo/takeover.py)."""

from __future__ import annotations

import threading
import types

from eagle3_target.client.nemo.takeover import ConfigOnlyLoader, fleet_target


def recipe_module() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        NeMoAutoModelForCausalLM="nemo's loader",
        TargetWrapper="nemo's wrapper",
        ImageLoader="nemo's image loader",
    )


def test_the_swap_is_undone_also_when_setup_raises():
    module = recipe_module()
    try:
        with fleet_target(module, "TargetWrapper", "ours", ImageLoader=ConfigOnlyLoader):
            swapped = (module.NeMoAutoModelForCausalLM, module.TargetWrapper, module.ImageLoader)
            assert swapped == (ConfigOnlyLoader, "ours", ConfigOnlyLoader)
            raise RuntimeError("setup failed")
    except RuntimeError:
        pass
    assert vars(module) == vars(recipe_module())


def test_two_setups_in_threads_leave_nemos_classes_in_place():
    """The second swap waits for the first to end: interleaved, the second would save the first's
    stand-ins and put them back after the first had restored NeMo's classes."""
    module, second_in = recipe_module(), threading.Event()

    def second() -> None:
        with fleet_target(module, "TargetWrapper", "second's"):
            second_in.set()

    with fleet_target(module, "TargetWrapper", "first's"):
        thread = threading.Thread(target=second)
        thread.start()
        assert not second_in.wait(0.5)  # not in while the first holds the swap
    thread.join(timeout=30)
    assert second_in.is_set()
    assert vars(module) == vars(recipe_module())
