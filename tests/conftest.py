import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

# The models here are tiny: one thread is faster than two that wait on each other, and the CLI
# subprocesses the tests start inherit the setting.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Tables printed by the in-process CLI are read by the tests at charlm's piped width (200), whatever
# width the shell that runs the tests exports; tests that want another width set it themselves.
os.environ.pop("COLUMNS", None)
torch.set_num_threads(1)


# --- no test sees the user's ./data, ./runs or ./sweeps ------------------------------------------------


@pytest.fixture(autouse=True)
def _in_a_directory_of_its_own(tmp_path, monkeypatch):
    """Every test runs in its own empty directory with CHARLM_DATA unset, so the defaults (./data,
    ./runs/..., ./sweeps/...) never reach the repository's directories, whatever a user has there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CHARLM_DATA", raising=False)


# --- corpora: the shared reference corpora, and a local HTTP server for download tests -----------

import http.server  # noqa: E402
import threading  # noqa: E402

import pytest  # noqa: E402

SHARED_CORPORA_DIR = Path(__file__).resolve().parents[2] / "shared" / "corpora"


@pytest.fixture
def shared_corpora() -> Path:
    """../shared/corpora next to the repository (PTB, War and Peace, a text8 prefix); skip if absent."""
    if not SHARED_CORPORA_DIR.is_dir():
        pytest.skip(f"the reference corpora are not at {SHARED_CORPORA_DIR}")
    return SHARED_CORPORA_DIR


class CorpusServer:
    """An HTTP server on 127.0.0.1 serving in-memory files, honouring Range, with injectable faults.

    ``files``: URL path → bytes. ``cut_short``: URL path → how many more responses to cut off
    halfway (the announced Content-Length is then a lie). ``honour_range``: False to answer Range
    requests with the whole file. ``requests``: (path, Range header) seen.
    """

    def __init__(self):
        self.files, self.cut_short, self.requests = {}, {}, []
        self.honour_range = True
        state = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                path = self.path.lstrip("/")
                state.requests.append((path, self.headers.get("Range")))
                if path not in state.files:
                    self.send_error(404)
                    return
                data, start = state.files[path], 0
                if state.honour_range and self.headers.get("Range", "").startswith("bytes="):
                    start = int(self.headers["Range"][len("bytes=") :].split("-")[0])
                    if start >= len(data):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                body = data[start:]
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if state.cut_short.get(path, 0) > 0:
                    state.cut_short[path] -= 1
                    body = body[: len(body) // 2]
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{path}"


@pytest.fixture
def corpus_server():
    server = CorpusServer()
    server.thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


# --- shared trained fixtures: prepared and trained once per session ----------------------------

from helpers import prepare_tiny_corpus, tiny_train  # noqa: E402


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory) -> Path:
    """The data root of a prepared `tiny` corpus (40,000 characters of Python's documentation)."""
    data_dir = tmp_path_factory.mktemp("tiny-corpus") / "data"
    prepare_tiny_corpus(data_dir)
    return data_dir


@pytest.fixture(scope="session")
def trained_run(tiny_corpus, tmp_path_factory) -> Path:
    """A small LRU trained for two epochs on `tiny`: the run directory. Tests must not modify it."""
    from charlm.config import TrainConfig
    from charlm.api import train

    run = tmp_path_factory.mktemp("trained") / "run"
    train(
        TrainConfig(
            corpus="tiny",
            cell="lru",
            hidden_size=32,
            batch_size=16,
            bptt=25,
            epochs=2,
            lr=3e-3,
            eval_batch_size=4,
            data_dir=str(tiny_corpus),
            run_dir=str(run),
        )
    )
    return run


SINK_RUN = dict(cell="lru", hidden_size=16, log_every=10, lr=None)  # tiny_train's settings but these


@pytest.fixture(scope="session")
def sink_corpus(tmp_path_factory) -> Path:
    """The data root of a `tiny` corpus of 8,000 characters, for the runs of the TensorBoard and W&B sinks' tests."""
    data_dir = tmp_path_factory.mktemp("sink-corpus") / "data"
    prepare_tiny_corpus(data_dir, characters=8_000)
    return data_dir


@pytest.fixture
def sink_train(sink_corpus):
    """``sink_train(run, *extra, **settings)``: the arguments of a small LRU's `charlm train` into ``run``
    (``tiny_train``'s), as the tests of the TensorBoard and W&B sinks train it."""

    def arguments(run, *extra, **settings):
        return tiny_train(sink_corpus, run, *extra, **{**SINK_RUN, **settings})

    return arguments


@pytest.fixture
def double_precision():
    """torch's default dtype float64 for one test (the reference checks of fast paths)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` need a CUDA device; without one they are skipped, saying so."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device (the cuda tests run where torch sees a GPU)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cell_device() -> torch.device:
    """Where the float64 reference checks of the cells run: the CPU, or ``CHARLM_TEST_DEVICE`` (for
    example ``CHARLM_TEST_DEVICE=cuda pytest tests/cells`` checks every cell's fast path on a GPU)."""
    name = os.environ.get("CHARLM_TEST_DEVICE", "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip(f"CHARLM_TEST_DEVICE={name}, but torch sees no CUDA device")
    return torch.device(name)
