"""`eagle3-target <command>`: each command lives with its part and is imported only when run,
so `eagle3-target operator` never imports torch."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# command -> module exposing add_arguments(parser) and run(args) -> int
COMMANDS = {
    "serve": ("eagle3_target.server.cli", "run a target server"),
    "operator": ("eagle3_target.operator.cli", "run the Eagle3Target operator"),
    "probe": (
        "eagle3_target.client.cli_probe",
        "list the target servers a trainer finds, with state and latency",
    ),
    "bench": ("eagle3_target.client.cli_bench", "measure client throughput with synthetic batches"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eagle3-target", description=__doc__.split("\n")[0])
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if a in COMMANDS), None)
    for name, (module, help_text) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # import only the module of the command being run
            importlib.import_module(module).add_arguments(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return importlib.import_module(COMMANDS[args.command][0]).run(args)


if __name__ == "__main__":
    sys.exit(main())
