"""`eagle3-target`'s own behaviour across commands: version, help with only the base install, one exit code per
kind of failure (docs/cli.md), logging options before or after the command."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import EXTRAS_MODULES
from target_support import free_port

from eagle3_target import __version__
from eagle3_target.cli import COMMANDS, build_parser
from eagle3_target.exits import Exit

ROOT = Path(__file__).resolve().parents[2]


def cli(
    *args: str, block: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`eagle3-target ARGS` in a fresh interpreter where the modules in ``block`` are not installed."""
    code = (
        "import sys\n"
        f"for name in {block!r}: sys.modules[name] = None\n"
        "from eagle3_target.cli import main\n"
        f"sys.exit(main({list(args)!r}))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_version():
    done = cli("--version")
    assert (done.returncode, done.stdout) == (0, f"eagle3-target {__version__}\n")


def test_top_level_help_describes_the_tool_in_a_whole_sentence():
    done = cli("--help", block=EXTRAS_MODULES)
    assert done.returncode == 0
    description = " ".join(done.stdout.split("\n\n")[1].split())
    assert description.endswith(".") and description[0].isupper() and len(description.split()) > 8
    assert all(name in done.stdout for name in COMMANDS)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_needs_only_the_base_install(command):
    done = cli(command, "--help", block=EXTRAS_MODULES)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: eagle3-target {command}")


@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_command_imports_torch_before_its_logging_is_quiet(command):
    """TORCH_LOGS (cli.QUIET_ENV) is read when torch is first imported: a parser that imports torch would let
    torch's own warnings (a library's deprecations) through to the command's stderr."""
    probe = f"import sys; from eagle3_target.cli import build_parser; build_parser({command!r}); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr


def test_train_draft_help_says_where_the_servers_come_from():
    done = cli("train-draft", "--help", block=EXTRAS_MODULES)
    text = " ".join(done.stdout.split())
    assert "remote_target.endpoints" in text and "$EAGLE3_TARGET_SERVICE" in text, done.stdout
    assert "remote_target.wait_timeout" in text


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_option_has_help_naming_its_default(command):
    parser, _ = build_parser(command)
    (sub,) = [a for a in parser._subparsers._group_actions if a.dest == "command"]  # noqa: SLF001
    text = sub.choices[command].format_help()
    undocumented = [
        a.option_strings[-1]
        for a in sub.choices[command]._actions  # noqa: SLF001
        if a.option_strings and not a.help
    ]
    assert not undocumented, text
    assert "(default: INFO)" in text  # --log-level after the command too


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bench", "--batch-size", "0"], "--batch-size: must be at least 1, got 0"),
        (["probe", "--pings", "many"], "--pings: invalid int value: 'many'"),
        (["operator", "--interval", "0"], "--interval: 0 would re-check without pause"),
        (["train-draft"], "the following arguments are required: --config"),
        (["probe", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["serve", "--port", "99999"], "--port: 99999 is not a port"),
        (["serve", "--max-queued-per-session", "0"], "--max-queued-per-session: must be at least 1, got 0"),
        (["serve", "--max-priority", "urgent"], "--max-priority: invalid choice: 'urgent'"),
    ],
)
def test_a_rejected_argument_is_a_usage_error_before_any_heavy_import(args, message):
    # The extras are blocked: had the command imported one before parsing, it would fail otherwise.
    done = cli(*args, block=EXTRAS_MODULES)
    assert done.returncode == Exit.USAGE and message in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.rstrip().endswith(
        f"(see eagle3-target {args[0]} --help)"
    )


@pytest.mark.parametrize(
    ("command", "blocked", "line"),
    [
        (
            "probe",
            "dns",
            "eagle3-target probe: error: dnspython is not installed; pip install 'eagle3-target[client]'",
        ),
        (
            "bench",
            "aiohttp",
            "eagle3-target bench: error: aiohttp is not installed; pip install 'eagle3-target[client]'",
        ),
        (
            "operator",
            "kopf",
            "eagle3-target operator: error: kopf is not installed; pip install 'eagle3-target[operator]'",
        ),
    ],
)
def test_a_missing_extra_is_one_line_naming_the_package_and_the_extra(command, blocked, line):
    done = cli(command, "http://127.0.0.1:9" if command != "operator" else "-A", block=(blocked,))
    assert (done.returncode, done.stderr.strip()) == (Exit.NOT_INSTALLED, line)


def test_an_unreachable_fleet_is_the_same_code_for_probe_and_bench():
    dead = f"http://127.0.0.2:{free_port('127.0.0.2')}"
    for command in ("probe", "bench"):
        done = cli(command, dead, "--resolve-timeout", "1")
        assert done.returncode == Exit.UNREACHABLE, done.stderr
    assert done.stderr.count("\n") == 1 and "no target server is reachable" in done.stderr


@pytest.mark.parametrize("before", [True, False])
def test_logging_options_before_or_after_the_command(before):
    dead = f"http://127.0.0.2:{free_port('127.0.0.2')}"
    options = ["--log-level", "debug", "--log-format", "json"]
    args = [*options, "probe", dead] if before else ["probe", dead, *options]
    done = cli(*args, "--resolve-timeout", "1")
    assert done.returncode == Exit.UNREACHABLE
    records = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert any(r["level"] == "DEBUG" for r in records), done.stderr  # asyncio's "Using selector"


def test_the_exit_code_table_in_the_docs_is_the_code():
    table = dict(re.findall(r"^\| (\d+) \| `(\w+)` \|", (ROOT / "docs" / "cli.md").read_text(), re.M))
    assert table == {str(int(code)): code.name for code in Exit}


def test_the_command_table_in_the_docs_lists_every_command():
    listed = re.findall(r"^\| `([\w-]+)` \| .+ \| `(\w+)` \|", (ROOT / "docs" / "cli.md").read_text(), re.M)
    assert dict(listed) == {name: extra for name, (_, _, extra) in COMMANDS.items()}


def test_the_operator_without_cluster_credentials_says_so_at_once(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_SERVICE")}
    done = cli("operator", "-A", env={**env, "KUBECONFIG": str(tmp_path / "absent"), "HOME": str(tmp_path)})
    assert done.returncode == Exit.USAGE and done.stderr.count("\n") == 1, done.stderr
    assert (
        done.stderr.startswith("eagle3-target operator: error: no cluster credentials")
        and "$KUBECONFIG" in done.stderr
    )


NOISE = """
import logging, sys, warnings
from eagle3_target.cli import configure_logging
from eagle3_target.client.cli_train_draft import OWN_LOGGERS
configure_logging(sys.argv[1], "text", ("eagle3_target", *OWN_LOGGERS))
logging.getLogger().setLevel(logging.DEBUG)  # as NeMo's setup_logging() resets it
import torch  # after the CLI set its environment, as a command's run() imports it
logging.getLogger("torch.utils._pytree").warning("pytree notice")
logging.getLogger("nemo_automodel._transformers").info("nemo info")
logging.getLogger("torchao").warning("torchao warning")
warnings.warn("import-time warning")
logging.getLogger("eagle3_target.client").info("our line")
logging.getLogger("nemo_automodel.recipes.llm.train_eagle3").info("the recipe's step line")
logging.getLogger("kopf.reactor").error("their error")
"""


@pytest.mark.parametrize("level", ["INFO", "DEBUG"])
def test_below_debug_a_command_prints_its_own_lines_only(level):
    """Other libraries' INFO and warnings (NeMo, torchao, torch's _pytree notices) and Python's warnings are
    silenced below DEBUG; their errors and the command's own lines (train-draft: NeMo's recipe) are not."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "TORCH_LOGS")}
    done = subprocess.run(
        [sys.executable, "-c", NOISE, level], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    shown = {t for t in ("pytree", "nemo info", "torchao", "import-time") if t in done.stderr}
    assert shown == (set() if level == "INFO" else {"pytree", "nemo info", "torchao", "import-time"}), (
        done.stderr
    )
    for line in ("our line", "the recipe's step line", "their error"):
        assert line in done.stderr, done.stderr
