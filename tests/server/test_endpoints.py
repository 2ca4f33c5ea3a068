"""The eight NeMo endpoints and our extensions, against a real server on loopback with a tiny Llama loaded from disk."""

import asyncio
import logging
import threading

import pytest
import torch
from target_support import WatchedRunner, generate_body, serve, served, spec_reference, vocab_body
from transformers import AutoModelForCausalLM

from eagle3_target.protocol import wire
from eagle3_target.protocol.contract import SUPERVISION_KEYS
from eagle3_target.server.options import ServerOptions
from eagle3_target.server.runners.hf import HFRunner
from eagle3_target.server.runners.synthetic import SyntheticRunner

V = 512


def draft_vocab(n=100, seed=0):
    ids = torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:n]  # unsorted, as NeMo builds it
    mask = torch.zeros(V, dtype=torch.bool)
    mask[ids] = True
    return ids, mask


async def test_health_readiness_liveness_and_exact_json_bytes(hf_server):
    for endpoint in ("health", "readyz"):
        async with hf_server.http.get(f"{hf_server.url}/{endpoint}") as resp:
            assert resp.status == 200 and await resp.read() == b'{"status": "ok"}'
    async with hf_server.http.get(f"{hf_server.url}/livez") as resp:
        assert resp.status == 200 and (await resp.json())["ready"] is True
    for endpoint, body in (("heartbeat", b""), ("init_nccl", b'{"nccl_port": 9}'), ("disconnect", b"{}")):
        async with hf_server.http.post(f"{hf_server.url}/{endpoint}", data=body) as resp:
            assert resp.status == 200
            expected = b'{"status": "disabled"}' if endpoint == "init_nccl" else b'{"status": "ok"}'
            assert await resp.read() == expected


async def test_model_info(hf_server):
    async with hf_server.http.post(f"{hf_server.url}/model_info", data=b"") as resp:
        info = await resp.json()
    assert list(info)[:4] == ["num_hidden_layers", "hidden_size", "vocab_size", "aux_layer_ids"]
    assert (info["num_hidden_layers"], info["hidden_size"], info["vocab_size"]) == (8, 64, V)
    assert info["aux_layer_ids"] == [1, 3, 4]
    assert info["engine"] == "hf" and info["dtype"] == "float32"


async def test_input_embeddings_are_the_model_weight(hf_server, tiny_model_dir):
    async with hf_server.http.post(f"{hf_server.url}/input_embeddings", data=b"") as resp:
        assert resp.headers["Content-Type"] == "application/octet-stream"
        weight = wire.decode(bytearray(await resp.read()))["weight"]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert torch.equal(weight, model.get_input_embeddings().weight)


async def test_generate_is_bit_identical_to_an_in_process_computation(hf_server, tiny_model_dir):
    ids, mask = draft_vocab()
    assert (await hf_server.post("set_vocab_mapping", vocab_body(ids, mask))).status == 200
    g = torch.Generator().manual_seed(3)
    input_ids = torch.randint(0, V, (2, 24), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 17:] = 0  # right padding
    loss_mask = attention_mask.clone()
    loss_mask[:, :5] = 0
    async with hf_server.http.post(
        f"{hf_server.url}/generate", data=generate_body(input_ids, attention_mask, loss_mask)
    ) as resp:
        assert resp.status == 200
        blob = bytearray(await resp.read())
    out = wire.decode(blob)
    assert list(out) == list(SUPERVISION_KEYS)

    # Independent reference: HF's own hidden_states (index i+1 is layer i's output), then the spec literally.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.inference_mode():
        res = model(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False
        )
    aux = torch.cat([res.hidden_states[i + 1] for i in (1, 3, 4)], dim=-1)
    ref = spec_reference(res.logits, aux, input_ids, loss_mask, ids, mask)
    for key in SUPERVISION_KEYS:
        assert out[key].dtype == ref[key].dtype and out[key].shape == ref[key].shape, key
        assert torch.equal(out[key], ref[key]), key


async def test_vocab_mapping_is_per_session_and_concurrent_clients_get_their_own_tensors(tiny_model_dir):
    async with serve(lambda: SyntheticRunner(vocab_size=V, forward_delay=0.05)) as srv:
        ids_a, mask_a = draft_vocab(50, seed=1)
        ids_b, mask_b = draft_vocab(80, seed=2)
        heads = {"a": {"X-Eagle3-Session": "a"}, "b": {"X-Eagle3-Session": "b"}}
        await srv.post("set_vocab_mapping", vocab_body(ids_a, mask_a), headers=heads["a"])
        await srv.post("set_vocab_mapping", vocab_body(ids_b, mask_b), headers=heads["b"])
        runner = SyntheticRunner(vocab_size=V)

        async def one(session, seed, ids, mask):
            input_ids = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(seed))
            async with srv.http.post(
                f"{srv.url}/generate", data=generate_body(input_ids), headers=heads[session]
            ) as r:
                out = wire.decode(bytearray(await r.read()))
            logits, aux = runner.forward(input_ids, torch.ones_like(input_ids))
            ref = spec_reference(logits, aux, input_ids, torch.ones_like(input_ids), ids, mask)
            return all(torch.equal(out[k], ref[k]) for k in SUPERVISION_KEYS)

        jobs = [one("a", s, ids_a, mask_a) for s in range(6)] + [
            one("b", 100 + s, ids_b, mask_b) for s in range(6)
        ]
        assert all(await asyncio.gather(*jobs))


async def test_other_endpoints_answer_during_a_slow_forward():
    runner = WatchedRunner(vocab_size=V, forward_delay=1.5)
    async with serve(lambda: runner) as srv:
        await srv.post("set_vocab_mapping", vocab_body(*draft_vocab()))
        runner.armed = True
        slow = asyncio.create_task(srv.post("generate", generate_body(torch.zeros(1, 4, dtype=torch.long))))
        assert await asyncio.to_thread(runner.forwarding.wait, 30)  # the forward runs on the model thread
        loop = asyncio.get_running_loop()
        for call in (srv.get("health"), srv.get("metrics"), srv.post("heartbeat")):
            start = loop.time()
            assert (await call).status == 200
            assert loop.time() - start < 0.5
        assert not slow.done()
        assert (await slow).status == 200


async def test_liveness_answers_while_the_model_loads():
    release = threading.Event()

    def slow_loader():
        release.wait(30)
        return SyntheticRunner(vocab_size=V)

    async with serve(slow_loader, wait=False) as srv:
        assert (await srv.get("livez")).status == 200
        health = await srv.get("health")
        assert health.status == 503
        resp = await srv.post("generate", generate_body(torch.zeros(1, 4, dtype=torch.long)))
        assert resp.status == 503
        metrics = await srv.http.get(f"{srv.url}/metrics")
        assert "eagle3_target_ready 0.0" in await metrics.text()
        release.set()
        await srv.wait_ready()
        assert (await srv.post("model_info")).status == 200


async def test_failed_load_stops_the_server():
    def broken():
        raise RuntimeError("no such model")

    async with serve(broken, wait=False) as srv:
        await asyncio.wait_for(srv.server.service.stopped.wait(), 10)
        assert isinstance(srv.server.service.model.load_error, RuntimeError)
        assert (await srv.get("livez")).status == 200  # still answers until the process exits


async def test_large_bodies_are_refused_with_413():
    async with serve(lambda: SyntheticRunner(vocab_size=V), ServerOptions(max_body_bytes=4096)) as srv:
        resp = await srv.post("generate", generate_body(torch.zeros(1, 1000, dtype=torch.long)))
        assert resp.status == 413
        assert (await srv.get("health")).status == 200


async def test_default_body_limit_admits_b8_s32768():
    body = generate_body(torch.zeros(8, 32768, dtype=torch.long))
    assert len(body) <= ServerOptions().max_body_bytes


async def test_bearer_token_guards_everything_but_probes_and_metrics():
    async with serve(lambda: SyntheticRunner(vocab_size=V), ServerOptions(auth_token="s3cret")) as srv:
        for endpoint in ("health", "livez", "readyz", "metrics"):
            assert (await srv.get(endpoint)).status == 200
        for endpoint in (
            "model_info",
            "heartbeat",
            "generate",
            "set_vocab_mapping",
            "init_nccl",
            "disconnect",
            "input_embeddings",
        ):
            async with srv.http.post(f"{srv.url}/{endpoint}", data=b"") as resp:
                assert resp.status == 401, endpoint
                assert (await resp.json())["error"] == "unauthorized"
        resp = await srv.post("model_info", headers={"Authorization": "Bearer wrong"})
        assert resp.status == 401
        resp = await srv.post("model_info", headers={"Authorization": "Bearer s3cret"})
        assert resp.status == 200


async def test_sessions_expire_disconnect_ends_only_the_callers_session():
    async with serve(lambda: SyntheticRunner(vocab_size=V), ServerOptions(session_ttl=2.0)) as srv:
        ids, mask = draft_vocab()
        a, b = {"X-Eagle3-Session": "a"}, {"X-Eagle3-Session": "b"}
        await srv.post("set_vocab_mapping", vocab_body(ids, mask), headers=a)
        await srv.post("set_vocab_mapping", vocab_body(ids, mask), headers=b)
        assert len(srv.server.service.sessions) == 2
        await srv.post("disconnect", b"{}", headers=a)
        assert (
            await srv.post("generate", generate_body(torch.zeros(1, 4, dtype=torch.long)), headers=a)
        ).status == 409
        assert (
            await srv.post("generate", generate_body(torch.zeros(1, 4, dtype=torch.long)), headers=b)
        ).status == 200
        assert not srv.server.service.stopped.is_set()
        # Heartbeats keep b alive past the ttl; a stays idle and is expired.
        await srv.post("heartbeat", headers=a)
        async with asyncio.timeout(30):
            while "a" in srv.server.service.sessions:
                await asyncio.sleep(0.1)
                await srv.post("heartbeat", headers=b)
        assert "b" in srv.server.service.sessions and len(srv.server.service.sessions) == 1
        assert (
            await srv.post("generate", generate_body(torch.zeros(1, 4, dtype=torch.long)), headers=b)
        ).status == 200


async def test_a_nemo_client_keeps_its_mapping_across_an_idle_pause_longer_than_the_ttl():
    """A stock NeMo client never heartbeats and cannot re-send its mapping: expiry must not strand it."""
    async with serve(lambda: SyntheticRunner(vocab_size=V), ServerOptions(session_ttl=1.0)) as srv:
        await srv.post("set_vocab_mapping", vocab_body(*draft_vocab()))  # no session header: named by peer
        await srv.post("set_vocab_mapping", vocab_body(*draft_vocab()), headers={"X-Eagle3-Session": "ours"})
        async with asyncio.timeout(10):
            while len(srv.server.service.sessions):
                await asyncio.sleep(0.2)  # both expire
        body = generate_body(torch.zeros(1, 4, dtype=torch.long))
        assert (await srv.post("generate", body)).status == 200
        assert (
            await srv.post("generate", body, headers={"X-Eagle3-Session": "ours"})
        ).status == 409  # re-sends


async def test_nemo_trainers_sharing_an_address_survive_each_others_disconnect():
    """Header-less trainers on one node are one session: one's goodbye must not strand the other."""
    async with serve(lambda: SyntheticRunner(vocab_size=V)) as srv:
        body = generate_body(torch.zeros(1, 4, dtype=torch.long))
        mapping = vocab_body(*draft_vocab())
        assert (await srv.post("set_vocab_mapping", mapping)).status == 200  # trainer 1
        assert (await srv.post("set_vocab_mapping", mapping)).status == 200  # trainer 2, same mapping
        assert (await srv.post("disconnect", b"{}")).status == 200  # trainer 1 is done
        assert (await srv.post("generate", body)).status == 200  # trainer 2 goes on
        assert b"eagle3_target_peer_mapping_conflicts_total 0.0" in await _metrics(srv)

        # Different mappings on one address: the last wins, with a warning and a counted conflict.
        assert (await srv.post("set_vocab_mapping", vocab_body(*draft_vocab(50, seed=1)))).status == 200
        assert b"eagle3_target_peer_mapping_conflicts_total 1.0" in await _metrics(srv)


async def _metrics(srv) -> bytes:
    async with srv.http.get(f"{srv.url}/metrics") as resp:
        return await resp.read()


async def test_sessions_past_max_sessions_get_429_and_live_ones_keep_working():
    async with serve(lambda: SyntheticRunner(vocab_size=V), ServerOptions(max_sessions=2)) as srv:
        body = generate_body(torch.zeros(1, 4, dtype=torch.long))
        mapping = vocab_body(*draft_vocab())
        for name in ("a", "b"):
            assert (
                await srv.post("set_vocab_mapping", mapping, headers={"X-Eagle3-Session": name})
            ).status == 200
        async with srv.http.post(f"{srv.url}/model_info", headers={"X-Eagle3-Session": "c"}) as resp:
            assert resp.status == 429 and resp.headers["Retry-After"] == "30"
            assert (await resp.json())["error"] == "too_many_requests"
        assert (await srv.post("generate", body, headers={"X-Eagle3-Session": "a"})).status == 200
        await srv.post("disconnect", b"{}", headers={"X-Eagle3-Session": "b"})
        assert (await srv.post("model_info", headers={"X-Eagle3-Session": "c"})).status == 200


async def test_exit_on_disconnect_keeps_nemo_behaviour():
    async with serve(lambda: SyntheticRunner(vocab_size=V), ServerOptions(exit_on_disconnect=True)) as srv:
        resp = await srv.post("disconnect", b"{}")
        assert resp.status == 200
        await asyncio.wait_for(srv.server.service.stopped.wait(), 5)


async def test_metrics_exist_and_move(hf_server):
    async def scrape():
        async with hf_server.http.get(f"{hf_server.url}/metrics") as resp:
            assert resp.headers["Content-Type"].startswith("text/plain")
            return await resp.text()

    before = await scrape()
    for name in (
        "eagle3_target_requests_total",
        "eagle3_target_request_duration_seconds_bucket",
        "eagle3_target_generate_phase_duration_seconds_bucket",
        "eagle3_target_tokens_total",
        "eagle3_target_sent_bytes_total",
        "eagle3_target_requests_in_flight",
        "eagle3_target_sessions_active",
        "eagle3_target_heartbeat_timestamp_seconds",
        "eagle3_target_model_load_seconds",
        "eagle3_target_ready",
        "eagle3_target_build_info",
        "eagle3_target_model_info",
    ):
        assert name in before, name
    assert "eagle3_target_ready 1.0" in before
    await hf_server.post("set_vocab_mapping", vocab_body(*draft_vocab()))
    await hf_server.post("generate", generate_body(torch.zeros(2, 10, dtype=torch.long)))
    await hf_server.post("heartbeat")
    after = await scrape()
    assert "eagle3_target_tokens_total 20.0" in after
    assert 'eagle3_target_requests_total{code="200",endpoint="generate"} 1.0' in after
    assert 'eagle3_target_generate_phase_duration_seconds_count{phase="forward"} 1.0' in after
    assert 'eagle3_target_generate_phase_duration_seconds_count{phase="send"} 1.0' in after
    sent = [
        line for line in after.splitlines() if line.startswith('eagle3_target_sent_bytes_total{path="wire"}')
    ]
    assert float(sent[0].split()[-1]) > 2 * 10 * 100 * 4
    assert "eagle3_target_sessions_active 1.0" in after
    heartbeat = [
        line for line in after.splitlines() if line.startswith("eagle3_target_heartbeat_timestamp_seconds ")
    ]
    assert float(heartbeat[0].split()[-1]) > 1.7e9


async def test_server_timing_reports_phases(hf_server):
    await hf_server.post("set_vocab_mapping", vocab_body(*draft_vocab()))
    resp = await hf_server.post("generate", generate_body(torch.zeros(1, 8, dtype=torch.long)))
    phases = [part.split(";")[0].strip() for part in resp.headers["Server-Timing"].split(",")]
    assert phases == ["decode", "forward", "projection", "copy", "encode"]


def test_hf_runner_captures_layer_outputs_of_mainstream_architectures():
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    small = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    for config_cls, model_cls in ((Qwen2Config, Qwen2ForCausalLM), (MistralConfig, MistralForCausalLM)):
        model = model_cls(config_cls(**small)).eval()
        runner = HFRunner(model, name=model_cls.__name__)
        assert runner.info.aux_layer_ids == [1, 3, 4]
        ids = torch.randint(0, 64, (2, 5))
        logits, aux = runner.forward(ids, torch.ones_like(ids))
        with torch.inference_mode():
            hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
        assert logits.shape == (2, 5, 64)
        assert torch.equal(aux, torch.cat([hidden[2], hidden[4], hidden[5]], dim=-1))


def test_hf_runner_rejects_bad_aux_layer_ids():
    with pytest.raises(ValueError, match="distinct"):
        HFRunner.load(aux_layer_ids=[2, 2, 3])


@pytest.mark.parametrize(
    "forward_delay, read_first",
    [(0.0, 1 << 16), (1.0, 0)],
    ids=["mid-response", "while-the-forward-runs"],
)
async def test_a_client_that_hangs_up_is_counted_as_499_and_serving_goes_on(
    caplog, forward_delay, read_first
):
    caplog.set_level(logging.DEBUG)
    runner = WatchedRunner(vocab_size=V, hidden_size=2048, forward_delay=forward_delay)
    async with serve(lambda: runner) as srv:
        await srv.post("set_vocab_mapping", vocab_body(*draft_vocab()))
        runner.armed = True
        big = generate_body(torch.zeros(4, 1024, dtype=torch.long))  # ~50 MB of supervision
        host, port = srv.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(big)}\r\n\r\n".encode() + big
        )
        await writer.drain()
        if read_first:
            await reader.readexactly(read_first)  # the response has started streaming
        else:
            assert await asyncio.to_thread(runner.forwarding.wait, 30)  # the forward runs: no reply yet
        writer.transport.abort()
        async with asyncio.timeout(10):
            while True:
                text = await (await srv.http.get(f"{srv.url}/metrics")).text()
                if 'eagle3_target_requests_total{code="499",endpoint="generate"} 1.0' in text:
                    break
                await asyncio.sleep(0.05)
        assert 'code="500"' not in text
        assert (await srv.post("generate", generate_body(torch.zeros(1, 4, dtype=torch.long)))).status == 200
    # Routine for a trainer that was stopped: one debug line, no traceback at any level.
    hangups = [r for r in caplog.records if "client went away mid-response" in r.getMessage()]
    assert [r.levelno for r in hangups] == [logging.DEBUG]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_a_wrong_method_on_a_known_endpoint_is_counted_under_that_endpoint():
    async with serve(lambda: SyntheticRunner(vocab_size=V)) as srv:
        assert (await srv.get("model_info")).status == 405
        assert (await srv.get("no/such/path")).status == 404
        assert served(srv.server, "model_info", "405") == 1
        assert served(srv.server, "unmatched", "404") == 1
        assert served(srv.server, "unmatched", "405") == 0


async def test_the_model_info_metric_lists_encodings_comma_joined():
    async with serve(lambda: SyntheticRunner(vocab_size=V)) as srv:
        registry = srv.server.metrics.registry
        labels = {"encodings": "nemo,logits,hidden", "engine": "synthetic"}
        samples = [s for m in registry.collect() if m.name == "eagle3_target_model" for s in m.samples]
        assert len(samples) == 1 and labels.items() <= samples[0].labels.items(), samples
