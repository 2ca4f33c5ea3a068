"""`eagle3-target install-tools`: kubectl and helm from the tools extra into a folder, and both run."""

from __future__ import annotations

import os
import subprocess
import sys

from eagle3_target.install_tools import LAYER_DIST


def install_tools(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"PATH": path} if path is not None else {})}
    return subprocess.run(
        [sys.executable, "-m", "eagle3_target.cli", "install-tools", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_kubectl_and_helm_land_in_the_folder_and_run(tmp_path):
    dest = tmp_path / "new" / "bin"  # created with its parents
    result = install_tools("--dir", str(dest), path=f"{dest}:{os.environ['PATH']}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split(" (from ")[0] for line in lines] == [str(dest / "helm"), str(dest / "kubectl")]
    assert all(f"(from {LAYER_DIST} " in line for line in lines)
    kubectl = subprocess.run([dest / "kubectl", "version", "--client"], capture_output=True, text=True)
    helm = subprocess.run([dest / "helm", "version", "--short"], capture_output=True, text=True)
    assert kubectl.returncode == 0 and "Client Version: v1." in kubectl.stdout
    assert helm.returncode == 0 and helm.stdout.startswith("v")
    assert sorted(p.name for p in dest.iterdir()) == ["helm", "kubectl"]  # no staging file left
    again = install_tools("--dir", str(dest), path=f"{dest}:{os.environ['PATH']}")
    assert (again.returncode, again.stdout) == (0, result.stdout)


def test_a_folder_off_path_is_named_with_the_line_that_adds_it(tmp_path):
    result = install_tools("--dir", str(tmp_path), path="/usr/bin:/bin")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == f"{tmp_path} is not on PATH: export PATH={tmp_path}:$PATH"


def test_a_dir_that_cannot_be_made_is_one_line_and_exit_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = install_tools("--dir", str(blocker / "bin"))
    assert result.returncode == 2
    assert result.stderr == f"eagle3-target install-tools: error: --dir {blocker / 'bin'}: Not a directory\n"
