"""`eagle3-target <command>`: each command lives with its part and is imported only when run,
so `eagle3-target operator` never imports torch."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# command -> (module exposing add_arguments(parser) and run(args) -> int, help, the extra it needs)
COMMANDS = {
    "serve": ("eagle3_target.server.cli", "run a target server", "server"),
    "operator": ("eagle3_target.operator.cli", "run the Eagle3Target operator", "operator"),
    "probe": (
        "eagle3_target.client.cli_probe",
        "list the target servers a trainer finds, with state and latency",
        "client",
    ),
    "bench": ("eagle3_target.client.cli_bench", "measure client throughput with synthetic batches", "client"),
    "train-draft": (
        "eagle3_target.client.cli_train_draft",
        "train an EAGLE-3 draft with NeMo's recipe against the target fleet",
        "nemo",
    ),
    "precompute": (
        "eagle3_target.client.precompute.cli",
        "write NeMo's offline EAGLE-3 cache with the target fleet",
        "precompute",
    ),
}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def load_command(name: str):
    """The command's module; a missing dependency is one line naming the extra that installs it."""
    module, _, extra = COMMANDS[name]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        sys.exit(
            f"eagle3-target {name}: error: {exc.name} is not installed; pip install 'eagle3-target[{extra}]'"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eagle3-target", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS, help="default INFO"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if a in COMMANDS), None)
    command = None
    for name, (_, help_text, _) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # import only the module of the command being run
            command = load_command(name)
            command.add_arguments(sub)
    args, unknown = parser.parse_known_args(argv)
    # A command that takes free-form overrides (train-draft: NeMo's --dotted.key=value) gets the
    # arguments argparse does not know; every other command rejects them as usual.
    if getattr(command, "ACCEPTS_OVERRIDES", False):
        args.overrides = unknown
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    # Logs go to stderr, so a command's stdout (probe --json) stays machine-readable.
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return load_command(args.command).run(args)


if __name__ == "__main__":
    sys.exit(main())
