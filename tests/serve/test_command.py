"""The `charlm serve` command: the install hint without the extra, the warning for every interface,
the API key from the environment, a port in use; the server itself is not started (uvicorn's run
is replaced by a recorder)."""

from __future__ import annotations

import socket
import sys

import pytest

from helpers import cli


def test_without_the_serve_extra_the_command_says_how_to_install_it(trained_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # `import fastapi` raises ImportError
    result = cli("serve", trained_run)
    assert result.returncode == 2
    assert (
        result.stderr
        == "charlm: error: charlm serve needs FastAPI and uvicorn: python3 -m pip install -e '.[serve]' in charlm's "
        "clone\n"
    )


@pytest.fixture
def started(monkeypatch):
    """What `charlm serve` would have run: the uvicorn config and the addresses it listened on."""
    uvicorn = pytest.importorskip("uvicorn", reason="needs the serve extra (pip install 'charlm[serve]')")
    runs = []

    def run(server, sockets=None):
        runs.append((server.config, [listening.getsockname() for listening in sockets]))
        for listening in sockets:
            listening.close()

    monkeypatch.setattr(uvicorn.Server, "run", run)
    return runs


def test_serving_every_interface_warns_and_names_the_models_by_run(trained_run, started, monkeypatch):
    monkeypatch.delenv("CHARLM_API_KEY", raising=False)
    result = cli("serve", trained_run, trained_run / "best.pt", "--host", "0.0.0.0", "--port", "0", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    warning, serving = result.stderr.splitlines()[-2:]
    assert warning == (
        "warning: listening on 0.0.0.0: anyone who can reach this machine can use the models "
        "(--api-key or CHARLM_API_KEY asks for a token)"
    )
    assert serving.startswith(f"serving {trained_run.name}, {trained_run.name}-2 on http://0.0.0.0:")
    [(config, addresses)] = started
    assert list(config.app.app.state.models) == [trained_run.name, f"{trained_run.name}-2"]
    assert config.app.api_key is None and config.access_log is False


def test_the_api_key_comes_from_the_environment_and_localhost_gives_no_warning(trained_run, started, monkeypatch):
    monkeypatch.setenv("CHARLM_API_KEY", "from-env")
    result = cli("serve", trained_run, "--port", "0", "--device", "cpu", "--max-text", "500")
    assert result.returncode == 0 and "warning" not in result.stderr
    [(config, addresses)] = started
    assert config.app.api_key == "from-env" and config.app.app.state.config.max_text == 500
    assert addresses[0][0] == "127.0.0.1"


def test_a_port_in_use_is_one_line_before_any_model_is_loaded(tmp_path, started):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        result = cli("serve", tmp_path / "no-such-run", "--port", taken.getsockname()[1])
    finally:
        taken.close()
    assert result.returncode == 2 and result.stderr.startswith("charlm: error: cannot listen on 127.0.0.1:")
    assert result.stderr.count("\n") == 1 and started == []


@pytest.mark.parametrize("host", ["h" * 64, "h" * 64 + ".example", "x" * 5000])
def test_a_host_no_resolver_takes_is_one_line(tmp_path, started, host):
    """A label over 63 characters failed inside the IDNA codec with a traceback."""
    result = cli("serve", tmp_path / "no-such-run", "--port", "0", "--host", host)
    assert result.returncode == 2 and result.stderr.startswith("charlm: error: cannot listen on '")
    assert "it is not a host name or an address" in result.stderr and result.stderr.count("\n") == 1 and started == []


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--port", "70000", "--port must be in [0, 65535], not 70000"),
        ("--concurrency", "0", "--concurrency must be at least 1, not 0"),
        ("--max-body", "10", "--max-body must be at least 1024, not 10"),
    ],
)
def test_limits_out_of_bounds_are_refused_in_one_line(trained_run, flag, value, message):
    result = cli("serve", trained_run, flag, value)
    assert (result.returncode, result.stderr) == (2, f"charlm: error: {message}\n")
