"""`probe` and `train-draft` without a writable temporary directory, as in a pod with a read-only root and no
volume at /tmp: one line and exit 2, before torch or NeMo is imported. The commands run in a mount namespace of
their own (util-linux `unshare`) where /tmp and /var/tmp are read-only bind mounts of themselves; /usr/tmp does
not exist and the working directory is /tmp, so tempfile finds nowhere to write."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from tiers import missing

READ_ONLY_TMP = (
    "for d in /tmp /var/tmp; do mount --bind $d $d && mount -o remount,ro,bind $d || exit 97; done; "
    '[ ! -e /usr/tmp ] || exit 98; cd /tmp && exec "$@"'
)
MESSAGE = (
    "no writable temporary directory ($TMPDIR, /tmp, /var/tmp, /usr/tmp and the working directory are all "
    "read-only or missing): mount a writable volume at /tmp (an emptyDir in a pod) or set TMPDIR"
)


def without_temp_dir(*argv: str) -> subprocess.CompletedProcess:
    unshare = shutil.which("unshare")
    if unshare is None:
        missing("unshare is not installed", "apt-get install util-linux")
    command = [unshare, "--user", "--map-root-user", "--mount", "sh", "-c", READ_ONLY_TMP, "sh", *argv]
    env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")}
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    if result.returncode in (97, 98) or "unshare:" in result.stderr:
        missing(
            f"no read-only /tmp could be made here: {result.stderr.strip()}",
            "run as root or allow user namespaces",
        )
    return result


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["probe", "http://127.0.0.1:9"], "probe"),
        (["train-draft", "--config", __file__], "train-draft"),
    ],
    ids=["probe", "train-draft"],
)
def test_a_read_only_temp_dir_is_refused_in_one_line(argv, command):
    result = without_temp_dir(sys.executable, "-m", "eagle3_target.cli", *argv)
    assert (result.returncode, result.stderr) == (2, f"eagle3-target {command}: error: {MESSAGE}\n")
    assert result.stdout == ""


def test_the_probe_goes_on_with_tmpdir_set():
    """TMPDIR, the way out the message names, is honoured: the probe gets past the check to the server, which
    does not answer (exit 4). /dev/shm stands for the writable volume (a tmpfs outside the read-only mounts)."""
    probe = [sys.executable, "-m", "eagle3_target.cli", "probe", "http://127.0.0.1:9", "--timeout", "1"]
    result = without_temp_dir("env", "TMPDIR=/dev/shm", *probe)
    assert "temporary directory" not in result.stderr
    assert result.returncode == 4, result.stderr
