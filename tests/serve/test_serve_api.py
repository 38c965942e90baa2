"""`charlm serve`'s JSON API, in process through the framework's TestClient: each endpoint against
`charlm sample` / `charlm score` and hand computations, every limit, every kind of bad request."""

from __future__ import annotations

import asyncio
import json
import re
import logging
import math

import pytest
import torch

pytest.importorskip("fastapi", reason="charlm serve's API tests need the serve extra (pip install 'charlm[serve]')")
from starlette.testclient import TestClient  # noqa: E402

from charlm.config_inference import ServeConfig  # noqa: E402
from charlm.serve.app import create_app  # noqa: E402
from helpers import cli  # noqa: E402


@pytest.fixture(scope="module")
def model(trained_run):
    import charlm

    return charlm.load(trained_run, device="cpu")


def client_for(model, api_key=None, **limits) -> TestClient:
    return TestClient(create_app({"tiny": model}, ServeConfig(**limits), api_key))


@pytest.fixture(scope="module")
def client(model):
    return client_for(model)


def events(text: str) -> list[dict]:
    return [json.loads(block.removeprefix("data: ")) for block in text.split("\n\n") if block.strip()]


def test_models_lists_each_model_with_its_size_vocabulary_and_test_score(client, model):
    [described] = client.get("/v1/models").json()["models"]
    assert described["name"] == "tiny" and described["cell"] == "lru" and described["corpus"] == "tiny"
    assert described["parameters"] == sum(p.numel() for p in model.network.parameters())
    assert described["vocabulary"] == model.vocabulary
    assert described["test_bpc"] == model.checkpoint.scores["test_bpc"]
    assert (described["layers"], described["hidden_size"], described["has_memory"]) == (1, 32, False)


def test_samples_are_the_text_charlm_sample_prints_for_the_same_seed(client, trained_run):
    body = {"prompt": "The ", "length": 40, "seed": 3, "num_samples": 2}
    samples = client.post("/v1/sample", json=body).json()["samples"]
    printed = cli(
        "sample",
        trained_run,
        "--prime",
        "The ",
        "--length",
        "40",
        "--seed",
        "3",
        "--num-samples",
        "2",
        "--device",
        "cpu",
    ).stdout
    assert printed == samples[0]["text"] + "\n\n" + samples[1]["text"] + "\n"
    assert [s["seed"] for s in samples] == [3, 4] and [s["symbols"] for s in samples] == [40, 40]
    assert samples[0]["text"] == "The " + samples[0]["continuation"]


def test_a_streamed_sample_sends_the_same_text_as_events(client):
    body = {"prompt": "In", "length": 60, "seed": 11, "top_k": 5}
    whole = client.post("/v1/sample", json=body).json()["samples"][0]["continuation"]
    response = client.post("/v1/sample", json={**body, "stream": True})
    assert response.headers["content-type"].startswith("text/event-stream")
    sent = events(response.text)
    assert [e["type"] for e in (sent[0], sent[-2], sent[-1])] == ["start", "end", "done"]
    assert sent[0]["prompt"] == "In" and sent[0]["seed"] == 11 and sent[-2]["symbols"] == 60
    assert "".join(e["text"] for e in sent if e["type"] == "text") == whole


def test_a_client_that_disconnects_stops_the_generation(model, monkeypatch):
    """Driven as ASGI: the client goes away once the first text has arrived; the server must not
    draw the rest of the 2,000 symbols it was asked for."""
    import charlm.serve.app as served

    monkeypatch.setattr(served, "STREAM_BATCH_S", 0.0)  # one symbol per event
    drawn = []
    original = model.stream

    def counting(*args, **kwargs):
        generation = original(*args, **kwargs)
        pieces = generation._pieces
        generation._pieces = (drawn.append(piece) or piece for piece in pieces)
        return generation

    monkeypatch.setattr(model, "stream", counting)
    app = create_app({"tiny": model}, ServeConfig())
    body = json.dumps({"prompt": "a", "length": 2000, "seed": 1, "stream": True}).encode()
    sent, texts = [], asyncio.Event()

    async def receive():
        if not sent:
            sent.append("request")
            return {"type": "http.request", "body": body, "more_body": False}
        await texts.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if b'"type": "text"' in message.get("body", b""):
            texts.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/sample",
        "raw_path": b"/v1/sample",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
    }
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 20))
    assert 1 <= len(drawn) < 200
    assert app.app.state.gate.admitted == 0  # the turn was given back


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
def test_a_client_gone_before_the_first_event_gives_its_turn_back(model, spec_version):
    """The client leaves before the response starts (the stream is never iterated, or its first
    send fails): the admitted request must still leave the queue."""
    app = create_app({"tiny": model}, ServeConfig(concurrency=1, queue=0))
    body = json.dumps({"prompt": "a", "length": 500, "seed": 1, "stream": True}).encode()
    received = []

    async def receive():
        received.append(1)
        if len(received) == 1:
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message):
        raise OSError("the client has gone")

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": spec_version},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/sample",
        "raw_path": b"/v1/sample",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
    }
    for _ in range(3):  # with one turn and no queue, a leaked turn would refuse the second request
        try:
            asyncio.run(asyncio.wait_for(app(scope, receive, send), 20))
        except Exception:  # the server may report the vanished client; it must not keep the turn
            pass
        received.clear()
        assert app.app.state.gate.admitted == 0


def test_score_gives_the_numbers_charlm_score_prints_and_the_models_alternatives(client, model, trained_run, tmp_path):
    text = "The cat sat on the mat.\nIt said: hello."
    result = client.post("/v1/score", json={"text": text, "top": 4}).json()
    source = tmp_path / "text.txt"
    source.write_text(text, encoding="utf-8")
    printed = cli("score", trained_run, source, "--per-char", "-", "--device", "cpu").stdout
    assert f"bpc             {result['bpc']:.4f}" in printed
    rows = [line.split("\t") for line in printed.splitlines() if line[:1].isdigit()]
    assert [float(row[2]) for row in rows] == pytest.approx([c["logprob"] for c in result["per_char"]], abs=2e-6)
    assert result["first"] == "T" and "".join(c["symbol"] for c in result["per_char"]) == text[1:]
    assert sum(c["logprob"] for c in result["per_char"]) == pytest.approx(-result["nats"], abs=1e-4)
    assert result["bits"] == pytest.approx(result["nats"] / math.log(2))
    assert result["bpc"] == pytest.approx(result["bits"] / (len(text) - 1))
    ids = torch.tensor([model.tokenizer.encode(text)])
    with torch.no_grad():
        logits, _ = model.network(ids[:, :-1], model.network.initial_state(1))
    probabilities = torch.softmax(logits[0], dim=-1)
    for position in (0, 7, len(text) - 2):
        char = result["per_char"][position]
        assert char["surprisal"] == pytest.approx(-char["logprob"] / math.log(2), abs=1e-5)
        expected = probabilities[position].topk(4)
        assert [a["symbol"] for a in char["top"]] == [model.vocabulary[i] for i in expected.indices.tolist()]
        assert [a["p"] for a in char["top"]] == pytest.approx(expected.values.tolist(), abs=1e-5)


def test_score_normalises_line_ends_and_the_byte_order_mark_as_charlm_score_does(client):
    plain = client.post("/v1/score", json={"text": "ab\ncd\nef", "top": 0}).json()
    windows = client.post("/v1/score", json={"text": "\ufeffab\r\ncd\ref", "top": 0}).json()
    assert windows["bits"] == plain["bits"] and windows["per_char"] == plain["per_char"]


def test_unknown_characters_are_named_or_skipped_as_asked(client):
    refused = client.post("/v1/score", json={"text": "ab\u00e9cd"})
    assert (
        refused.status_code == 400
        and "'é'" in refused.json()["error"]
        and "line 1, column 3" in refused.json()["error"]
    )
    skipped = client.post("/v1/score", json={"text": "ab\u00e9cd", "unknown": "skip", "top": 0}).json()
    assert skipped["skipped"] == 1 and [c["symbol"] for c in skipped["per_char"]] == ["b", "c", "d"]
    assert client.post("/v1/sample", json={"prompt": "\u00e9"}).status_code == 400


def test_activations_of_every_unit_give_back_the_models_logits(client, model):
    """One layer: the softmax layer applied to the returned hidden states is the model's own output."""
    text = "Hello, world"
    result = client.post("/v1/activations", json={"text": text, "units": list(range(32))}).json()
    assert result["symbols"] == list(text) and result["memory"] is None and result["width"] == 32
    hidden = torch.tensor(result["hidden"]).T  # [T, 32]
    ids = torch.tensor([model.tokenizer.encode(text)])
    with torch.no_grad():
        logits, _ = model.network(ids, model.network.initial_state(1))
        rebuilt = model.network.head(hidden)
    assert rebuilt.flatten().tolist() == pytest.approx(
        logits[0].flatten().tolist(), abs=2e-3
    )  # the values are rounded to 4 places


def test_activations_without_units_give_the_units_that_vary_most(client):
    text = "The quick brown fox jumps."
    every = client.post("/v1/activations", json={"text": text, "units": list(range(32))}).json()
    spread = torch.tensor(every["hidden"]).std(dim=1)
    top = client.post("/v1/activations", json={"text": text, "top": 3}).json()
    assert top["units"] == spread.argsort(descending=True)[:3].tolist()
    assert top["hidden"] == [every["hidden"][unit] for unit in top["units"]]


@pytest.mark.parametrize(
    "body, status, fragment",
    [
        ({"text": "abc", "layer": 1}, 400, "layer must be in [0, 0]"),
        ({"text": "abc", "units": [32]}, 400, "units must be in [0, 31]"),
        ({"text": "", "units": [0]}, 400, "the text is empty"),
    ],
)
def test_activations_refuse_a_layer_or_unit_the_model_lacks(client, body, status, fragment):
    response = client.post("/v1/activations", json=body)
    assert response.status_code == status and fragment in response.json()["error"]


@pytest.mark.parametrize(
    "path, body, status, message",
    [
        ("/v1/score", "{bad", 400, "the request body is not valid JSON"),
        ("/v1/score", "", 400, "the request needs a JSON body"),
        ("/v1/score", "[1, 2]", 400, "the request body must be a JSON object"),
        ("/v1/score", '{"text": 5}', 400, "text: input should be a valid string"),
        ("/v1/sample", '{"length": "40"}', 400, "length: input should be a valid integer"),
        ("/v1/sample", '{"seed": 1.5}', 400, "seed: input should be a valid integer"),
        ("/v1/score", '{"text": "ab", "path": "/etc/passwd"}', 400, "unknown field 'path'"),
        ("/v1/score", '{"text": "ab", "model": "../run"}', 404, "no model named '../run' (served: tiny)"),
        ("/v1/score", '{"text": "a"}', 400, "the text is too short to score: it needs at least two symbols"),
        ("/v1/score", '{"text": "ab", "top": 50}', 400, "top: input should be less than or equal to 20"),
        ("/v1/sample", '{"temperature": -1}', 400, "temperature must be zero or positive, not -1.0"),
        ("/v1/sample", '{"top_p": 1.5}', 400, "top_p must be in (0, 1], not 1.5"),
        ("/v1/sample", '{"length": 2001}', 400, "length is 2,001: the limit is 2,000 (--max-length)"),
        ("/v1/sample", '{"num_samples": 5}', 400, "num_samples is 5: the limit is 4 (--max-samples)"),
        ("/v1/sample", '{"num_samples": 0}', 400, "num_samples must be at least 1, not 0"),
        (
            "/v1/sample",
            '{"seed": 1180591620717411303424}',
            400,
            "seed: input should be less than or equal to 4611686018427387904",
        ),
        ("/v1/sample", '{"temperature": 1e999}', 400, "temperature must be a finite number, not inf"),
        ("/v1/sample", '{"prompt": ""}', 400, "the prime is empty: give at least one symbol"),
        ("/v1/sample", '{"stop": [""]}', 400, "stop must be a non-empty string, not ''"),
        # Python's json reads NaN
        ("/v1/sample", '{"temperature": NaN}', 400, "temperature must be zero or positive, not nan"),
        ("/v1/sample", '{"top_p": Infinity}', 400, "top_p must be in (0, 1], not inf"),
        (
            "/v1/sample",
            '{"beam": 1, "num_samples": 2}',
            400,
            "num_samples must be 1 with beam search: it gives the one most probable continuation",
        ),  # as charlm sample
        ("/v1/sample", '{"beam": 17}', 400, "beam is 17: the limit is 16 (--max-beam)"),
        (
            "/v1/sample",
            json.dumps({"stop": ["x"] * 17}),
            400,
            "stop: list should have at most 16 items after validation, not 17",
        ),
        ("/v1/activations", '{"text": "abc", "layer": -1}', 400, "layer must be in [0, 0] (the model has 1), not -1"),
        (
            "/v1/sample",
            json.dumps({"prompt": "a" * 2001}),
            413,
            "the prompt is 2,001: the limit is 2,000 (--max-prompt)",
        ),
        ("/v1/score", json.dumps({"text": "a" * 20_001}), 413, "the text is 20,001: the limit is 20,000 (--max-text)"),
        ("/v1/nothing", "{}", 404, "Not Found"),
    ],
)
def test_a_bad_request_gets_a_4xx_with_a_one_line_json_error(client, path, body, status, message):
    response = client.post(path, content=body, headers={"content-type": "application/json"})
    assert (response.status_code, response.json()) == (status, {"error": message})


def test_a_body_over_the_limit_is_refused_before_it_is_read_whole(model):
    client = client_for(model, max_body=2048)
    declared = client.post("/v1/score", content=b"x" * 4096, headers={"content-type": "application/json"})
    assert declared.status_code == 413 and "limit of 2,048 bytes (--max-body)" in declared.json()["error"]

    def chunks():  # no content-length: counted as it arrives
        for _ in range(5):
            yield b"x" * 1000

    streamed = client.post("/v1/score", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413


def test_beyond_the_queue_the_server_answers_503_busy(model):
    client = client_for(model, concurrency=1, queue=1)
    gate = client.app.app.state.gate
    gate.admit(), gate.admit()  # one computing, one waiting
    response = client.post("/v1/score", json={"text": "abc"})
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json()["error"].startswith("the server is busy: 1 requests computing and 1 waiting")
    gate.leave()
    assert client.post("/v1/score", json={"text": "abc", "top": 0}).status_code == 200
    assert gate.admitted == 1


def test_an_api_key_is_asked_of_every_v1_request_but_not_of_the_page(model):
    client = client_for(model, api_key="s3cret")
    refused = client.get("/v1/models")
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert "Authorization: Bearer KEY" in refused.json()["error"]
    assert client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/").status_code == 200


def test_the_page_and_its_script_ship_in_the_package_and_fetch_nothing_elsewhere(client):
    page, script = client.get("/"), client.get("/app.js")
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    assert '<script src="/app.js">' in page.text and script.headers["content-type"].startswith("text/javascript")
    for text in (page.text, script.text):
        assert "http://" not in text and "https://" not in text and "//cdn" not in text
    assert all(view in page.text for view in ('data-view="write"', 'data-view="read"', 'data-view="inside"'))


def test_the_api_pages_load_their_scripts_from_this_server(client):
    """/docs (Swagger UI) and /redoc must work on a machine without the internet."""
    for path in ("/docs", "/redoc"):
        page = client.get(path)
        assert page.status_code == 200 and "cdn." not in page.text
        sources = re.findall(r'(?:src|href)="([^"]+)"', page.text) + re.findall(r"url: '([^']+)'", page.text)
        assert sources and all(source.startswith("/") for source in sources), sources
        for source in sources:
            fetched = client.get(source)
            assert fetched.status_code == 200 and len(fetched.content) > 0, source
    assert "/v1/score" in client.get("/openapi.json").json()["paths"]


def test_each_request_is_logged_in_one_line(client, caplog):
    logger = logging.getLogger("charlm")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="charlm"):
            client.post("/v1/score", json={"text": "abc", "top": 0})
            client.post("/v1/score", content="{bad", headers={"content-type": "application/json"})
    finally:
        logger.removeHandler(caplog.handler)
    lines = [r.getMessage() for r in caplog.records if '"POST /v1/score"' in r.getMessage()]
    assert len(lines) == 2 and lines[0].startswith('testclient "POST /v1/score" 200 ') and " 400 " in lines[1]
