"""The HTTP application of `charlm serve`: the JSON API under /v1 and the page at /.

Every answer to a bad request is a 4xx with ``{"error": "one line"}``; the models compute in worker
threads, a few requests at a time (``Gate``), so that the server keeps answering while they do.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi_offline import FastAPIOffline  # FastAPI whose /docs page ships its scripts: no CDN
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from charlm import __version__
from charlm.api import Model
from charlm.config_inference import SampleConfig, ServeConfig
from charlm.settings import validate
from charlm.errors import CharlmError, ConfigError, OutOfVocabulary
from charlm.inference.beam import check_beam_settings
from charlm.logs import get_logger
from charlm.serve.analysis import activations, score_text
from charlm.serve.limits import Busy, Gate, Guard
from charlm.serve.models import describe
from charlm.serve.schemas import ActivationsRequest, SampleRequest, ScoreRequest

PAGE = Path(__file__).parent / "page"
STREAM_BATCH_S = 0.02  # a streamed sample sends what was drawn in this long as one event
PAGE_POLICY = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:"  # nothing from elsewhere


class Refused(Exception):
    """A request the server will not compute: its status and its one line."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def create_app(models: dict[str, Model], config: ServeConfig = ServeConfig(), api_key: str | None = None):
    """The ASGI application serving ``models`` (by name) under ``config``'s limits."""
    app = FastAPIOffline(
        title="charlm",
        version=__version__,
        description="Character-level language models: sample, "
        'score, and look inside. Errors are {"error": "one line"}.',
    )
    app.state.models, app.state.config, app.state.gate = models, config, Gate(config.concurrency, config.queue)
    _add_error_handlers(app)
    _add_routes(app, models, config, app.state.gate)
    return Guard(app, config.max_body, api_key)


def _add_error_handlers(app: FastAPI) -> None:
    def error(status: int, message: str, headers=None) -> JSONResponse:
        return JSONResponse({"error": " ".join(str(message).split())}, status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        return error(400, validation_line(exc.errors()))

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):
        return error(exc.status_code, exc.detail, getattr(exc, "headers", None))

    @app.exception_handler(Refused)
    async def refused(request, exc: Refused):
        return error(exc.status, str(exc))

    @app.exception_handler(Busy)
    async def busy(request, exc: Busy):
        return error(503, str(exc), {"Retry-After": "1"})

    @app.exception_handler(CharlmError)
    async def bad_input(request, exc: CharlmError):
        if isinstance(exc, OutOfVocabulary) and exc.where is not None:  # the API's own field, not --unknown
            exc = exc.skipped_by('send "unknown": "skip" to leave them out')
        return error(400, f"{exc.field} {exc.reason}" if isinstance(exc, ConfigError) else str(exc))

    @app.exception_handler(Exception)
    async def failure(request, exc: Exception):
        get_logger().error(f"error: {type(exc).__name__}: {exc}")
        return error(500, "internal error: the server's log says more")


def validation_line(errors) -> str:
    """One line for the first problem pydantic found in a body."""
    first = errors[0] if errors else {}
    kind, where = first.get("type", ""), ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    if kind == "json_invalid":
        return "the request body is not valid JSON"
    if not where:
        return "the request body must be a JSON object" if kind != "missing" else "the request needs a JSON body"
    if kind == "extra_forbidden":
        return f"unknown field {where!r}"
    return f"{where}: {first.get('msg', 'is not valid').lower()}"


def _pick(models: dict[str, Model], name: str | None) -> tuple[str, Model]:
    if name is None:
        name = next(iter(models))
    if name not in models:
        raise Refused(404, f"no model named {name!r} (served: {', '.join(models)})")
    return name, models[name]


def _within(what: str, value: int, limit: int, flag: str, status: int = 400) -> None:
    if value > limit:
        raise Refused(status, f"{what} is {value:,}: the limit is {limit:,} ({flag})")


async def _compute(gate: Gate, function, *args):
    gate.admit()
    try:
        async with gate.turn():
            return await anyio.to_thread.run_sync(function, *args)
    finally:
        gate.leave()


def _add_routes(app: FastAPI, models: dict[str, Model], config: ServeConfig, gate: Gate) -> None:
    @app.get("/", include_in_schema=False)
    async def page():
        return HTMLResponse(
            (PAGE / "index.html").read_text(encoding="utf-8"), headers={"Content-Security-Policy": PAGE_POLICY}
        )

    @app.get("/app.js", include_in_schema=False)
    async def script():
        return Response((PAGE / "app.js").read_text(encoding="utf-8"), media_type="text/javascript")

    @app.get("/v1/models", summary="The models served: cell, size, corpus, vocabulary, scores")
    async def list_models():
        return {"models": [describe(name, model) for name, model in models.items()]}

    @app.post("/v1/sample", summary="Generate text; with stream: true, as server-sent events")
    async def sample(body: SampleRequest, request: Request):
        name, model = _pick(models, body.model)
        _within("the prompt", len(body.prompt or ""), config.max_prompt, "--max-prompt", 413)
        _within("length", body.length, config.max_length, "--max-length")
        _within("num_samples", body.num_samples, config.max_samples, "--max-samples")
        _within("beam", body.beam, config.max_beam, "--max-beam")
        _check_sample_settings(body)
        base_seed = body.seed
        if base_seed is None and not body.beam:
            base_seed = random.SystemRandom().randrange(2**31)
        prompt = model.sample(None, length=0) if body.prompt is None else body.prompt
        first = _start(model, body, base_seed)  # checks the settings and the prompt before anything is sent
        if body.stream:
            gate.admit()
            return GatedStream(gate, first, _events(model, body, base_seed, prompt, first, gate, request))
        samples = await _compute(gate, _draw_all, model, body, base_seed, prompt, first)
        return {"model": name, "samples": samples}

    @app.post("/v1/score", summary="Bits of a text, and per character its log probability, surprisal, alternatives")
    async def score(body: ScoreRequest):
        name, model = _pick(models, body.model)
        _within("the text", len(body.text), config.max_text, "--max-text", 413)
        return {"model": name, **await _compute(gate, score_text, model, body.text, body.unknown, body.top)}

    @app.post("/v1/activations", summary="A layer's hidden state (and cell memory) after each character")
    async def look_inside(body: ActivationsRequest):
        name, model = _pick(models, body.model)
        _within("the text", len(body.text), config.max_text, "--max-text", 413)
        units = None if body.units is None else list(body.units)
        return {
            "model": name,
            **await _compute(gate, activations, model, body.text, body.layer, units, body.top, body.unknown),
        }


class GatedStream(StreamingResponse):
    """Server-sent events that give the request's turn back however the response ends: finished,
    stopped by the client, or never started because the client left first (then the events are
    never iterated, so their own ``finally`` would not run)."""

    def __init__(self, gate: Gate, generation, events):
        super().__init__(events, media_type="text/event-stream", headers={"Cache-Control": "no-store"})
        self.gate, self.generation = gate, generation

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        except ClientDisconnect:  # nobody is left to answer
            get_logger().info("the client left before its stream ended")
        finally:
            await self.body_iterator.aclose()
            self.generation.close()
            self.gate.leave()


def _check_sample_settings(body: SampleRequest) -> None:
    """The request's settings together, by the checks `charlm sample` makes (``Model.stream`` sees
    one sample's: not ``num_samples``, which beam search refuses beyond 1)."""
    settings = SampleConfig(
        length=body.length,
        temperature=body.temperature,
        top_k=body.top_k,
        top_p=body.top_p,
        seed=body.seed,
        num_samples=body.num_samples,
        beam=body.beam,
        stop=list(body.stop),
    )
    validate(settings)
    check_beam_settings(settings)


def _seed(base_seed: int | None, index: int) -> int | None:
    return None if base_seed is None else base_seed + index


def _start(model: Model, body: SampleRequest, base_seed: int | None, index: int = 0):
    return model.stream(
        body.prompt,
        body.length,
        body.temperature,
        body.top_k,
        body.top_p,
        _seed(base_seed, index),
        stop=body.stop,
        beam=body.beam,
    )


def _draw_all(model: Model, body: SampleRequest, base_seed, prompt: str, first) -> list[dict]:
    """Every sample, as `charlm sample` draws them: sample i with seed + i."""
    samples = []
    for index in range(body.num_samples):
        generation = first if index == 0 else _start(model, body, base_seed, index)
        continuation = "".join(generation)
        samples.append(
            {
                "text": prompt + continuation,
                "continuation": continuation,
                "seed": _seed(base_seed, index),
                "symbols": len(generation.ids),
            }
        )
    return samples


def _take(generation, seconds: float | None = None) -> str | None:
    """What the generation draws in about ``seconds`` (default: ``STREAM_BATCH_S`` as it is now; None: it has
    ended)."""
    seconds = STREAM_BATCH_S if seconds is None else seconds
    taken, started = [], time.perf_counter()
    for piece in generation:
        taken.append(piece)
        if time.perf_counter() - started >= seconds:
            break
    return "".join(taken) if taken else None


def _event(fields: dict) -> str:
    return f"data: {json.dumps(fields)}\n\n"


async def _events(model: Model, body: SampleRequest, base_seed, prompt: str, first, gate: Gate, request: Request):
    """Server-sent events: start, text..., end for each sample, then done; a client that goes
    away stops the drawing at the next batch."""
    generation = first
    try:
        async with gate.turn():
            for index in range(body.num_samples):
                if index:
                    generation = _start(model, body, base_seed, index)
                yield _event({"type": "start", "index": index, "seed": _seed(base_seed, index), "prompt": prompt})
                while True:
                    if await request.is_disconnected():
                        return
                    text = await anyio.to_thread.run_sync(_take, generation)
                    if text is None:
                        break
                    yield _event({"type": "text", "index": index, "text": text})
                yield _event({"type": "end", "index": index, "symbols": len(generation.ids)})
            yield _event({"type": "done"})
    except CharlmError as error:
        yield _event({"type": "error", "error": " ".join(str(error).split())})
    finally:
        generation.close()  # the first is closed again by GatedStream, which also gives the turn back
