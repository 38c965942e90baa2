"""`charlm serve`: models behind an HTTP API and a web page (the optional extra charlm[serve])."""

from __future__ import annotations

import os
import sys
from typing import List, Optional
import socket

import typer

from charlm.cli.loading import CELL, DEVICE, NO_CUDA_GRAPH, TRUST_CODE, load_model, warn_if_corpus_changed
from charlm.cli.options import settings_options
from charlm.config_inference import ServeConfig
from charlm.settings import validate
from charlm.errors import CharlmError, shown
from charlm.logs import get_logger

LOOPBACK = ("127.0.0.1", "localhost", "::1")
INSTALL = "charlm serve needs FastAPI and uvicorn: python3 -m pip install -e '.[serve]' in charlm's clone"


@settings_options(ServeConfig)
def serve(
    checkpoints: List[str] = typer.Argument(
        ...,
        metavar="RUN_OR_CHECKPOINT",
        help="Run directories (their "
        "best.pt), checkpoint files or exported models; requests pick one by "
        "name (GET /v1/models lists them).",
    ),
    device: str = DEVICE,
    cell: Optional[str] = CELL,
    trust_code: bool = TRUST_CODE,
    no_cuda_graph: bool = NO_CUDA_GRAPH,
    given: dict = None,
):
    """Serve models: a JSON API (/v1, documented at /docs) and a page at / to write, read and look inside."""
    config = ServeConfig(**given)
    validate(config)
    try:
        import fastapi  # noqa: F401
        import fastapi_offline  # noqa: F401
        import uvicorn
    except ImportError:
        raise CharlmError(INSTALL) from None
    from charlm.serve.app import create_app
    from charlm.serve.models import named

    api_key = config.api_key or os.environ.get("CHARLM_API_KEY") or None
    listening = _listen(config.host, config.port)  # before loading: a port in use is said at once
    models = named(checkpoints, lambda reference: load_model(reference, device, cell, trust_code, no_cuda_graph))
    log = get_logger()
    for model in models.values():
        warn_if_corpus_changed(model, "serving")
    if config.host not in LOOPBACK:
        log.warning(
            f"warning: listening on {config.host}: anyone who can reach this machine can use the models"
            + ("" if api_key else " (--api-key or CHARLM_API_KEY asks for a token)")
        )
    host, port = listening.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    log.info(
        f"serving {', '.join(models)} on http://{shown}:{port}/ (API under /v1, documented at /docs; Ctrl-C stops)"
    )
    sys.stderr.flush()
    server = uvicorn.Server(
        uvicorn.Config(create_app(models, config, api_key), log_level="warning", access_log=False, lifespan="off")
    )
    server.run(sockets=[listening])


def _listen(host: str, port: int):
    """A socket bound to ``host``:``port``, or one line saying why not."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listening = socket.socket(family, socket.SOCK_STREAM)
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind((host, port))
    except OSError as error:
        raise CharlmError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    except (UnicodeError, ValueError) as error:  # a name no resolver takes: a label over 63 characters, a NUL
        raise CharlmError(f"cannot listen on {shown(host)}: it is not a host name or an address ({error})") from None
    listening.listen(128)
    listening.set_inheritable(True)
    return listening


def register(app: typer.Typer) -> None:
    app.command()(serve)
