"""spec.generation: the switch and the cap reach the server's flags, the defaults add none (so a target written
before the field keeps its pods), the CRD's defaults and bounds agree with the operator's, and /v1 is on the
Services' http port."""

from __future__ import annotations

import jsonschema
import pytest
import yaml
from crd_support import CRD_PATH, crd_schema, default

from eagle3_target.operator import builders, discovery
from eagle3_target.operator.target_spec import TargetSpec

DEFAULT_ARGS = builders.server_args(TargetSpec.parse({"model": "m"}), 0)


def args_of(**generation) -> list[str]:
    spec = TargetSpec.parse({"model": "m", "generation": generation})
    assert spec.problems() == []
    return builders.pod(spec, "t", "ml", 0, "img")["spec"]["containers"][0]["args"]


def test_generation_is_on_by_default_without_a_flag_of_its_own():
    assert args_of() == args_of(enabled=True) == DEFAULT_ARGS
    assert not any("generation" in a for a in DEFAULT_ARGS)
    assert builders.revision(TargetSpec.parse({"model": "m", "generation": {"enabled": True}})) == (
        builders.revision(TargetSpec.parse({"model": "m"}))
    )


def test_the_switch_and_the_cap_become_serve_flags():
    assert args_of(enabled=False) == DEFAULT_ARGS + ["--no-generation"]
    assert args_of(maxTokens=512) == DEFAULT_ARGS + ["--max-generation-tokens", "512"]
    # a change of either is a new revision: `serve` reads its flags once, so pods are replaced
    revisions = {
        builders.revision(TargetSpec.parse({"model": "m", "generation": g}))
        for g in ({}, {"enabled": False}, {"maxTokens": 512}, {"maxTokens": 1024})
    }
    assert len(revisions) == 4


@pytest.mark.parametrize(
    ("generation", "fragment"),
    [
        ({"enabled": False, "maxTokens": 10}, "generation.enabled is false"),
        ({"maxTokens": 0}, "between 1 and"),
        ({"maxTokens": (1 << 20) + 1}, "between 1 and"),
    ],
)
def test_the_operator_refuses_what_the_crd_refuses(generation, fragment):
    problems = TargetSpec.parse({"model": "m", "generation": generation}).problems()
    assert any(fragment in p for p in problems), problems


def test_crd_defaults_and_bounds_agree_with_the_operator():
    schema = crd_schema()
    spec_schema = schema["properties"]["spec"]
    defaulted = default(spec_schema, {"model": "m"})
    assert defaulted["generation"] == {"enabled": True}
    assert TargetSpec.parse(defaulted).generation == TargetSpec.parse({"model": "m"}).generation
    validator = jsonschema.Draft7Validator(schema)
    assert not list(validator.iter_errors({"spec": {"model": "m", "generation": {"maxTokens": 1 << 20}}}))
    for bad in ({"maxTokens": 0}, {"maxTokens": (1 << 20) + 1}, {"enabled": "yes"}):
        assert list(validator.iter_errors({"spec": {"model": "m", "generation": bad}})), bad
    rules = spec_schema["properties"]["generation"]["x-kubernetes-validations"]
    assert [r["rule"] for r in rules] == ["self.enabled || !has(self.maxTokens)"]  # tests/cluster/test_crd.py


def test_v1_is_served_on_the_services_http_port():
    """OpenAI clients take a base URL: http://<target>.<namespace>.svc:<ports.http>/v1, the port named http."""
    spec = TargetSpec.parse({"model": "m", "ports": {"http": 9000}})
    service = discovery.service(spec, "t", "ml")
    (http,) = [p for p in service["spec"]["ports"] if p["name"] == "http"]
    assert http["port"] == 9000 and http["targetPort"] == "http"
    container = builders.pod(spec, "t", "ml", 0, "img")["spec"]["containers"][0]
    assert {"name": "http", "containerPort": 9000, "protocol": "TCP"} in container["ports"]
    assert container["args"][container["args"].index("--port") + 1] == "9000"


def test_the_example_target_sets_a_cap():
    docs = [d for d in yaml.safe_load_all((CRD_PATH.parent / "example-target.yaml").read_text()) if d]
    example = next(d for d in docs if d["kind"] == "Eagle3Target")
    assert TargetSpec.parse(example["spec"]).generation.max_tokens == 4096


@pytest.mark.parametrize("generation", [{}, {"enabled": False}, {"maxTokens": 512}])
def test_the_servers_own_parser_reads_the_flags(generation):
    """The flags the operator writes are the ones `serve` defines (server/generation_options.py)."""
    import argparse

    from eagle3_target.server import generation_options

    parser = argparse.ArgumentParser(exit_on_error=False)
    generation_options.add_arguments(parser)
    spec = TargetSpec.parse({"model": "m", "generation": generation})
    options = generation_options.GenerationOptions.from_args(parser.parse_args(spec.generation.server_args()))
    assert options.enabled == spec.generation.enabled
    assert options.max_tokens == (
        spec.generation.max_tokens or generation_options.DEFAULT_MAX_GENERATION_TOKENS
    )
