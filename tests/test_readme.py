"""The README's two fresh-machine commands are what users and CI run."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())[:2]


def test_readme_opens_with_serve_then_test_commands():
    serve, test = readme_commands()
    assert serve.startswith("pip install torch==2.13.0") and serve.endswith("eagle3-target serve")
    assert test.startswith("pip install torch==2.13.0") and test.endswith("python -m pytest -q")


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci
