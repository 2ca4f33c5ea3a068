"""`eagle3-target refresh` against real servers on loopback: every replica refreshed, its version printed,
and a refusal named by URL with a non-zero exit."""

import asyncio
import contextlib
import json
import os
import sys

import pytest
from target_support import serve

from eagle3_target.server.options import ServerOptions
from eagle3_target.server.runners.hf import HFRunner
from eagle3_target.server.runners.tiny import build_tiny_llama

ADMIN = "fleet-admin"


@pytest.fixture(scope="module")
def weights_b(tmp_path_factory):
    path = tmp_path_factory.mktemp("weights-b")
    build_tiny_llama(seed=2).save_pretrained(path)
    return path


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "admin-token"
    path.write_text(ADMIN + "\n")
    return path


async def cli(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "eagle3_target.cli",
        "refresh",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=os.environ.copy(),
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode, out.decode(), err.decode()


async def version_of(server) -> str:
    async with server.http.post(f"{server.url}/model_info") as resp:
        return (await resp.json())["target_version"]


@contextlib.asynccontextmanager
async def fleet(model_dir, *admin_tokens):
    async with contextlib.AsyncExitStack() as stack:
        yield [
            await stack.enter_async_context(
                serve(lambda: HFRunner.load(model_dir), ServerOptions(admin_token=token))
            )
            for token in admin_tokens
        ]


async def test_every_replica_is_refreshed_and_its_version_printed(tiny_model_dir, weights_b, token_file):
    async with fleet(tiny_model_dir, ADMIN, ADMIN) as servers:
        urls = [s.url for s in servers]
        code, out, err = await cli(
            "--url",
            *urls,
            "--from",
            str(weights_b),
            "--version",
            "step-9",
            "--admin-token-file",
            str(token_file),
            "--max-parallel",
            "1",
        )
        assert code == 0, err
        assert out.splitlines() == [f"{url}: step-9" for url in urls]
        assert [await version_of(s) for s in servers] == ["step-9", "step-9"]


async def test_a_refusal_names_the_replica_and_stops_the_rollout(tiny_model_dir, weights_b, token_file):
    async with fleet(tiny_model_dir, ADMIN, None, ADMIN) as servers:
        before = await version_of(servers[2])
        code, out, err = await cli(
            "--url",
            *[s.url for s in servers],
            "--from",
            str(weights_b),
            "--version",
            "step-9",
            "--admin-token-file",
            str(token_file),
        )
        assert code == 1 and out.splitlines() == [f"{servers[0].url}: step-9"]
        line = err.strip()
        assert line == (
            f"eagle3-target refresh: error: {servers[1].url} refused the refresh: 403 refresh_disabled: this "
            "server was started without --admin-token-file: it refreshes no weights; 1 not tried"
        )
        assert await version_of(servers[2]) == before  # a refused rollout goes no further


@pytest.mark.parametrize(
    "args, says",
    [
        (["--version", "a b"], "--version a target version is"),
        (["--version", "v1", "--max-parallel", "0"], "--max-parallel must be at least 1"),
    ],
)
async def test_bad_arguments_are_one_line(args, says, token_file):
    code, out, err = await cli(
        "--url", "http://127.0.0.1:9", "--from", "/x", "--admin-token-file", str(token_file), *args
    )
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and says in err, err


async def test_a_replica_that_does_not_answer_is_named(token_file):
    code, _, err = await cli(
        "--url",
        "http://127.0.0.1:9",
        "--from",
        "/x",
        "--version",
        "v1",
        "--admin-token-file",
        str(token_file),
    )
    assert code == 1 and "http://127.0.0.1:9 refused the refresh: ClientConnectorError" in err
    assert json.dumps(err.strip()).count("\\n") == 0
