"""`eagle3-target train-draft --config X.yaml [--dotted.key=value ...]`: a NeMo draft recipe on the fleet.

The YAML's ``recipe:`` key picks the recipe as NeMo's launcher does (a class name, a dotted path or
``{_target_: path}``; default TrainEagle3Recipe); the families' modules (client/nemo/registry.py) name those
the fleet trains. The overrides are NeMo's own (``--checkpoint.checkpoint_dir=D``, ``--remote_target.endpoints=...``):
they are checked for shape here and applied by NeMo's config parser.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle3_target.exits import CommandError, Exit
from eagle3_target.protocol.contract import SERVICE_ENV

# The top-level CLI hands the arguments it does not know to this command as args.overrides.
ACCEPTS_OVERRIDES = True
# NeMo's recipe logs the run (steps, losses, checkpoints): those lines are this command's own.
OWN_LOGGERS = ("nemo_automodel.recipes.llm.train_eagle3",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        required=True,
        type=Path,
        help="NeMo recipe YAML (required); its recipe: key picks the recipe",
    )
    p.epilog = (
        "Any --dotted.key=value (or --dotted.key value) overrides that key of the YAML. The target servers are "
        "the YAML's remote_target.endpoints (URLs, host:port, or srv:// / dns:// names), else "
        f"${SERVICE_ENV}, which the operator sets in trainer pods; remote_target.wait_timeout bounds the wait "
        "for them."
    )


def override_argv(tokens: list[str]) -> list[str]:
    """The overrides as ``--key=value`` tokens; a stray token is an error, not silently dropped."""
    overrides: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        key = token[2:].split("=", 1)[0]
        if not token.startswith("--") or not key or key.startswith("-"):
            raise ValueError(f"unexpected argument {token!r}: overrides look like --dotted.key=value")
        if "=" not in token and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            overrides.append(f"{token}={tokens[i + 1]}")
            i += 2
        else:
            overrides.append(token if "=" in token else f"{token}=true")
            i += 1
    return overrides


def plain(value):
    """A config value as plain YAML data (NeMo's parser gives sections as ConfigNode)."""
    return value.to_dict() if hasattr(value, "to_dict") else value


def run(args: argparse.Namespace) -> int:
    try:
        overrides = override_argv(getattr(args, "overrides", []))
    except ValueError as exc:
        raise CommandError(str(exc), Exit.USAGE) from None
    if not args.config.is_file():
        raise CommandError(f"--config {args.config}: no such file", Exit.USAGE)
    from .temp_dir import require_temp_dir

    require_temp_dir()  # before NeMo's and torch's imports, which need one
    try:
        from . import nemo  # first: its ImportError says what to install
        from .nemo import registry
        from .nemo._imports import nemo_module
        from .nemo.fleet_target import FleetMismatchError
        from .nemo.recipe_keys import check_recipe_args
    except ImportError as exc:
        raise CommandError(str(exc), Exit.NOT_INSTALLED) from None
    import yaml  # NeMo's own YAML library

    from .endpoints import EndpointError
    from .fleet_errors import fleet_errors

    parser = nemo_module("components.config._arg_parser")
    bad_input = (EndpointError, ValueError, yaml.YAMLError)
    try:
        cfg = parser.parse_args_and_load_config(argv=["--config", str(args.config), *overrides])
        recipe_class = nemo.recipe_class(registry.recipe_name(plain(cfg.get("recipe", None))))
        check_recipe_args(recipe_class, plain(cfg.get("recipe_args", None)))  # before NeMo reads any
        recipe = recipe_class(cfg)
    except ImportError as exc:  # NeMo without the recipe's dependencies
        raise CommandError(str(exc), Exit.NOT_INSTALLED) from None
    except bad_input as exc:
        raise CommandError(" ".join(str(exc).split()), Exit.USAGE) from None
    try:
        with fleet_errors():  # no server ready within remote_target.wait_timeout: one line, exit 4
            recipe.setup()
    except FleetMismatchError as exc:  # found when the fleet answers, before the first step
        raise CommandError(str(exc), Exit.USAGE) from None
    recipe.run_train_validation_loop()
    return 0
