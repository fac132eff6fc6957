"""Schemathesis against ``/openapi.json`` of a real coordinator on localhost.

Positive data (schema-valid requests) must get a status the document lists for
that operation, never a 5xx, with a body matching the documented schema;
negative data (schema-invalid requests) must get a 4xx JSON error. A method a
path does not serve must get 405 with ``Allow``. The example counts are bounded
so the run stays well under a minute.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import schemathesis
from coordinator_helpers import AUTH, registration
from hypothesis import HealthCheck, given, reject, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance
from test_coordinator_fuzz import Server

from netopt.coordinator.openapi import openapi_document


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with Server(tmp_path_factory.mktemp("openapi")) as srv:
        yield srv


# Cases per operation: positive, negative (invalid bodies are large and slow to make).
EXAMPLES = {GenerationMode.POSITIVE: 15, GenerationMode.NEGATIVE: 6}


def _negatable(definition: dict[str, Any]) -> bool:
    """Whether negative data can break anything but the token (which the test always sends):
    a body, or query parameters of a route without path names. Negating a path name
    pattern is slow to generate (a minute for the history route); the fuzz test
    (test_coordinator_fuzz.py) sends hostile path segments instead."""
    where = {p.get("in") for p in definition.get("parameters", [])}
    return "requestBody" in definition or ("query" in where and "path" not in where)


def _negated_beyond_the_token(case: schemathesis.Case) -> bool:
    """Whether a negative case breaks more than headers: the test always sends the real
    token, which makes a case whose only invalid part was Authorization a valid one."""
    meta = case._meta  # which components were made invalid
    if meta is None:
        return True
    return any(
        info.mode is GenerationMode.NEGATIVE and str(where.value) != "header"
        for where, info in meta.components.items()
    )


def _run(server: Server, mode: GenerationMode) -> list[str]:
    """Every operation of the served document, ``EXAMPLES[mode]`` cases each."""
    base_url = f"http://127.0.0.1:{server.port}"
    api = schemathesis.openapi.from_url(base_url + "/openapi.json")
    failures: list[str] = []
    for result in api.get_all_operations():
        operation = result.ok()
        if mode is GenerationMode.NEGATIVE and not _negatable(operation.definition.raw):
            continue

        @given(operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES[mode], deadline=None, database=None,
            suppress_health_check=list(HealthCheck),
        )  # fmt: skip
        def check(case: schemathesis.Case) -> None:
            if mode is GenerationMode.POSITIVE:
                # Schema-valid but refused (400) is allowed: cross-field rules (src != dst,
                # min <= p50 <= ... <= max, received <= sent) are beyond JSON Schema; they
                # are in the descriptions, and 400 is a documented answer.
                case.call_and_validate(
                    base_url=base_url, headers=AUTH, excluded_checks=[positive_data_acceptance]
                )
                return
            if not _negated_beyond_the_token(case):
                reject()
            # Schema-invalid: any 4xx JSON error (413 for an oversized body included),
            # checked here instead of by schemathesis' list of expected statuses.
            response = case.call_and_validate(
                base_url=base_url, headers=AUTH, excluded_checks=[negative_data_rejection]
            )
            assert 400 <= response.status_code < 500, (response.status_code, response.text[:200])
            assert "error" in response.json(), response.text[:200]

        try:
            check()
        except Exception as exc:  # collected, reported together
            failures.append(f"{operation.label}: {str(exc)[:1500]}")
    return failures


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_request_gets_a_documented_answer(server: Server, mode: GenerationMode) -> None:
    failures = _run(server, mode)
    assert not failures, "\n\n".join(failures)


def test_a_wrong_method_gets_405_with_allow(server: Server) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("PATCH", "/api/v1/nodes", headers=AUTH)
        response = conn.getresponse()
        body = json.loads(response.read())
    finally:
        conn.close()
    assert response.status == 405
    assert "GET" in response.headers["Allow"]
    assert body["error"] == "MethodNotAllowed"


@pytest.mark.parametrize(
    ("query", "status", "says"),
    [
        ("window_s=60", 200, None),
        ("window_s=1&window_s=1", 400, "'window_s' given more than once"),
        ("window_s=60&window_s=x", 400, "'window_s' given more than once"),
        ("windw_s=60", 400, "unknown parameter(s) 'windw_s'"),
    ],
    ids=["once", "twice-same", "twice-different", "typo"],
)
def test_a_query_parameter_is_documented_and_given_once(
    server: Server, query: str, status: int, says: str | None
) -> None:
    """Every documented query parameter is a scalar: a repeated one is refused, not read
    as its first value (the negative fuzzing sent ``window_s`` as an array)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", f"/api/v1/links?{query}", headers=AUTH)
        response = conn.getresponse()
        body = json.loads(response.read())
    finally:
        conn.close()
    assert response.status == status, body
    if says is not None:
        assert says in body["message"], body


@pytest.mark.parametrize(
    "name", ["ip-10-0-0-1.ec2.internal", "a" * 63, "hk-1"], ids=["eks", "63", "short"]
)
def test_the_document_accepts_the_node_names_the_server_accepts(server: Server, name: str) -> None:
    status, _ = server.request(
        "POST", "/api/v1/agents/register", json.dumps(registration(name, "hk")).encode()
    )
    assert status == 200
    name_schema = openapi_document()["components"]["schemas"]["Registration"]["properties"]["node"]
    jsonschema.validate(name, name_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate("a" * 64, name_schema)
