"""Who may call a mesh, with real processes. Started with an API key (``seawall up --api-key`` /
``$SEAWALL_API_KEY``), every client-facing call needs the key, over HTTP (OpenAI's Bearer header, Anthropic's
x-api-key) and gRPC (the SDK sends it); health, version and metrics stay open, and the workers register without
it. With ``--allowed-origins``, browser pages from those origins may call the HTTP API (CORS). With
``--served-model-name``, requests may name the model by any of its names; with ``--return-tokens-as-token-ids``,
logprobs name tokens by id unless a request says otherwise."""

from __future__ import annotations

import grpc
import httpx
import pytest

from seawall import Client
from seawall.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common.errors import Unauthenticated
from tests.e2e.conftest import start_mesh

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
KEY = "sk-seawall-test"
UI = "http://ui.example:3000"


@pytest.fixture(scope="module")
def keyed(tiny_model_dir, tmp_path_factory):
    mesh = start_mesh(tiny_model_dir, tmp_path_factory.mktemp("logs"), mode="colocated", api_key=KEY,
                      scheduler_args=["--allowed-origins", UI, "--served-model-name", "tiny-chat", "tiny",
                                      "--return-tokens-as-token-ids"])
    yield mesh
    mesh.stop()


def test_http_calls_need_the_key_and_operators_endpoints_do_not(keyed):
    completion = {"prompt": "Hi", "max_tokens": 2}
    with httpx.Client(base_url=keyed.http_url, timeout=60) as http:
        for headers, status in (({}, 401), ({"Authorization": "Bearer nope"}, 401),
                                ({"Authorization": f"Bearer {KEY}"}, 200), ({"authorization": f"bearer {KEY}"}, 200),
                                ({"x-api-key": KEY}, 200)):
            reply = http.post("/v1/completions", json=completion, headers=headers)
            assert reply.status_code == status, (headers, reply.text)
        missing = http.get("/v1/models")
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert "Authorization: Bearer KEY" in missing.json()["error"]["message"]
        wrong = http.post("/v1/messages", headers={"x-api-key": "nope"},
                          json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
        for path in ("/health", "/version", "/metrics"):
            assert http.get(path).status_code == 200, path
        streamed = http.post("/v1/chat/completions", headers={"x-api-key": KEY}, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True})
        assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")


def test_grpc_calls_need_the_key_and_the_sdk_sends_it(keyed, monkeypatch):
    monkeypatch.delenv("SEAWALL_API_KEY", raising=False)
    with Client(keyed.grpc_address) as client, pytest.raises(Unauthenticated, match="needs an API key"):
        client.generate("Hi", max_tokens=2)
    with Client(keyed.grpc_address, api_key="nope") as client, pytest.raises(Unauthenticated, match="not this"):
        client.stats()
    with Client(keyed.grpc_address, api_key=KEY) as client:
        assert len(client.generate("Hi", max_tokens=3, ignore_eos=True).token_ids) == 3
        assert len(client.stats().workers) == 1  # it registered without the key
    monkeypatch.setenv("SEAWALL_API_KEY", KEY)
    with Client(keyed.grpc_address) as client:
        assert sum(len(c.token_ids) for c in client.stream("Hi", max_tokens=2, ignore_eos=True)) == 2
    with grpc.insecure_channel(keyed.grpc_address) as channel:  # health is open (compose's healthcheck)
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as refused:  # a streaming call is refused before it starts, too
            list(scheduler_pb2_grpc.SchedulerStub(channel).Generate(scheduler_pb2.GenerateRequest()))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as unknown:  # open, as RegisterWorker: the workers call it on SIGTERM
            scheduler_pb2_grpc.SchedulerStub(channel).DrainWorker(scheduler_pb2.DrainWorkerRequest(address="nowhere:1"))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND and "no live worker" in unknown.value.details()


def test_pages_from_an_allowed_origin_may_call_the_api_from_a_browser(keyed):
    with httpx.Client(base_url=keyed.http_url, timeout=60) as http:
        # The preflight carries no key (browsers send none with it); the call after it does.
        preflight = http.options("/v1/chat/completions", headers={
            "Origin": UI, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == UI
        reply = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                          headers={"Origin": UI, "Authorization": f"Bearer {KEY}"})
        assert reply.status_code == 200 and reply.headers["access-control-allow-origin"] == UI
        assert "x-queue-time" in reply.headers["access-control-expose-headers"]
        refused = http.post("/v1/completions", json={"prompt": "Hi"}, headers={"Origin": UI})
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == UI  # readable
        other = http.options("/v1/completions", headers={"Origin": "http://elsewhere.example",
                                                          "Access-Control-Request-Method": "POST"})
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


def test_the_model_answers_to_each_of_its_served_names(keyed, tiny_model_dir):
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=keyed.http_url, timeout=60, headers=auth) as http:
        listed = [m["id"] for m in http.get("/v1/models").json()["data"]]
        assert listed == ["tiny-chat", "tiny"]
        assert http.get("/v1/models/tiny").json()["id"] == "tiny"  # each name's card, as OpenAI retrieves one
        for name in ("tiny-chat", "tiny", str(tiny_model_dir), ""):  # the first name answers for all of them
            reply = http.post("/v1/completions", json={"model": name, "prompt": "Hi", "max_tokens": 1})
            assert reply.status_code == 200 and reply.json()["model"] == "tiny-chat", name
        unknown = http.post("/v1/completions", json={"model": tiny_model_dir.name + "-x", "prompt": "Hi"})
        assert unknown.status_code == 404 and "serves 'tiny-chat'" in unknown.json()["error"]["message"]


def test_the_server_wide_token_names_are_a_default_a_request_may_override(keyed):
    body = {"prompt": "Hi", "max_tokens": 3, "logprobs": 1, "return_token_ids": True}
    with httpx.Client(base_url=keyed.http_url, timeout=60, headers={"Authorization": f"Bearer {KEY}"}) as http:
        named = http.post("/v1/completions", json=body).json()["choices"][0]
        texts = http.post("/v1/completions", json={**body, "return_tokens_as_token_ids": False}).json()["choices"][0]
    assert named["logprobs"]["tokens"] == [f"token_id:{t}" for t in named["token_ids"]]
    assert not any(t.startswith("token_id:") for t in texts["logprobs"]["tokens"])
