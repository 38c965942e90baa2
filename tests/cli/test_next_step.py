"""Messages that say the right next step: a close name suggested, no retry where none can help, why a
run has no checkpoint yet, advice in the terms of whoever asked, and `--temperature 0` as greedy."""

from __future__ import annotations

import errno
import socket

import pytest

import charlm
from charlm.corpora.download import DownloadPolicy, RemoteFile, fetch
from charlm.errors import CharlmError, NoCheckpoint, closest
from charlm.runs.directory import Run
from helpers import assert_one_line_error, cli, tiny_train

# --- did you mean -------------------------------------------------------------------------------------


def test_the_closest_name_is_suggested_whatever_its_case_and_none_that_is_far():
    assert closest("mingr", ["lstm", "mingru", "minlstm"]) == "mingru"
    assert closest("LSTM", ["lstm", "gru"]) == "lstm"
    assert closest("nope", ["lstm", "gru"]) is None


def test_a_misspelt_cell_or_corpus_gets_a_suggestion(tiny_corpus, tmp_path):
    result = cli(*tiny_train(tiny_corpus, tmp_path / "r", cell="GRU"))
    assert result.stderr == (
        "charlm: error: unknown cell 'GRU': did you mean 'gru'? (`charlm cells` lists every cell; module:Class "
        "names your own)\n"
    )
    result = cli(*tiny_train(tiny_corpus, tmp_path / "r", corpus="tiyn"))
    assert result.stderr.splitlines()[-1] == (  # a corpus prepared in the data directory is a name too
        f"charlm: error: corpus 'tiyn' is not prepared in {tiny_corpus}/: did you mean 'tiny'? (or prepare your "
        "own text under this name with `charlm prepare text PATH... --name tiyn`)"
    )
    assert not (tmp_path / "r").exists()


def test_a_downloaded_corpus_not_prepared_names_a_local_copy_too(tmp_path):
    result = cli("train", "--corpus", "ptb-bpe500", "--data-dir", tmp_path / "data", "--run-dir", tmp_path / "r")
    assert_one_line_error(
        result,
        "run `charlm prepare ptb --subword bpe --vocab-size 500` (or `charlm prepare ptb --source PATH "
        "--subword bpe --vocab-size 500` with a local copy)",
    )
    assert_one_line_error(cli("train", "--corpus", "pydoc", "--data-dir", tmp_path / "data"), "`charlm prepare pydoc`")
    assert "--source" not in cli("train", "--corpus", "pydoc", "--data-dir", tmp_path / "data").stderr


# --- downloads that no retry can mend -----------------------------------------------------------------


def _no_name_lookup(*args, **kwargs):
    raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")


def _no_route(*args, **kwargs):
    raise OSError(errno.ENETUNREACH, "Network is unreachable")


@pytest.mark.parametrize(
    "patched, failure",
    [
        ("getaddrinfo", "Temporary failure in name resolution"),
        ("create_connection", "Network is unreachable"),
    ],
    ids=["no name lookup", "no route"],
)
def test_offline_a_download_stops_at_once(monkeypatch, tmp_path, patched, failure):
    import charlm.corpora.download as download

    waits, messages = [], []
    monkeypatch.setattr(download.time, "sleep", waits.append)
    monkeypatch.setattr(socket, patched, _no_name_lookup if patched == "getaddrinfo" else _no_route)
    remote = RemoteFile("http://corpora.example/text8.zip", "text8.zip")
    with pytest.raises(CharlmError) as caught:
        fetch(remote, tmp_path, policy=DownloadPolicy(attempts=5), progress=False, log=messages.append)
    assert str(caught.value).startswith("cannot reach corpora.example (") and failure in str(caught.value)
    assert str(caught.value).endswith(
        "which no retry mends (is this machine offline?). Download http://corpora.example/text8.zip another way and "
        "pass it with --source PATH, or use a mirror with --url URL"
    )
    assert waits == [] and messages == []


def test_offline_prepare_fails_at_once_and_says_how_to_use_a_local_copy(monkeypatch, tmp_path):
    import charlm.corpora.download as download

    waits = []
    monkeypatch.setattr(download.time, "sleep", waits.append)
    monkeypatch.setattr(socket, "getaddrinfo", _no_name_lookup)
    result = cli("prepare", "ptb", "--quiet", "--data-dir", tmp_path)
    assert_one_line_error(result, "cannot reach www.fit.vutbr.cz (", "(is this machine offline?)", "--source PATH")
    assert waits == [] and "retrying" not in result.stderr


# --- a run without a checkpoint -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "save_every, when",
    [
        ("5m", "5 minutes into its training (--save-every 5m) or at the end of its first epoch, whichever comes first"),
        ("500", "at step 500 (--save-every 500) or at the end of its first epoch, whichever comes first"),
        ("0", "at the end of its first epoch"),
    ],
)
def test_a_run_that_is_training_says_when_its_first_checkpoint_comes(tmp_path, save_every, when):
    run = Run.create(tmp_path / "run", {"train": {"save_every": save_every}, "model": {}}, {})
    try:
        result = cli("sample", tmp_path / "run")
        holder = run.lock_file.read_text(encoding="utf-8").strip()
        expected = (
            f"run directory {tmp_path / 'run'} holds no checkpoint yet: it is training ({holder}) and saves its "
            f"first checkpoint {when}"
        )
        assert result.returncode == 2 and result.stderr == f"charlm: error: {expected}\n"
        with pytest.raises(NoCheckpoint) as caught:
            charlm.load(tmp_path / "run")
        assert str(caught.value) == expected
    finally:
        run.release()


def test_a_run_that_stopped_before_its_first_save_says_so(tmp_path):
    run = Run(tmp_path / "run")
    run.path.mkdir()
    run.config_file.write_text('{"train": {}, "model": {}}', encoding="utf-8")
    run.record("start", parameters=10)
    assert_one_line_error(
        cli("eval", run.path),
        f"run directory {run.path} holds no checkpoint: its training was interrupted before its first save; "
        f"continue it with `charlm train --resume {run.path}`",
    )
    run.record("diverged", epoch=1, step=3, loss=1e30)
    assert_one_line_error(
        cli("sample", run.path),
        f"run directory {run.path} holds no checkpoint: its training diverged before its first save",
    )


# --- a local copy named as given; a checkpoint cut short ----------------------------------------------


def test_a_local_copy_of_one_file_is_named_as_given(tmp_path):
    mine = tmp_path / "mine.txt"
    mine.write_text("First Citizen:\n" * 100, encoding="utf-8")
    result = cli("prepare", "shakespeare", "--source", mine, "--data-dir", tmp_path / "data")
    assert_one_line_error(result, f"--source {mine} differs from the published corpus: its sha256: expected 86c4")
    assert "input.txt" not in result.stderr
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café\n".encode("latin-1"))
    result = cli("prepare", "wp", "--source", latin, "--no-verify", "--quiet", "--data-dir", tmp_path / "data")
    assert_one_line_error(result, f"{latin} is not UTF-8 text: byte 0xe9 at offset 3")
    assert "warpeace_input.txt" not in result.stderr.splitlines()[-1]


@pytest.mark.parametrize("keep", [1, 3, 4, 10, 21, 400, -100])
def test_a_checkpoint_cut_short_anywhere_is_one_line_of_ours(trained_run, tmp_path, keep):
    cut = tmp_path / "cut.pt"
    cut.write_bytes((trained_run / "best.pt").read_bytes()[:keep])
    result = cli("sample", cut)
    assert result.stderr == (
        f"charlm: error: {cut} is not a readable charlm checkpoint: the file is empty, truncated or not a torch file\n"
    )


# --- --temperature 0 ------------------------------------------------------------------------------------


def test_temperature_zero_is_greedy_as_beam_one_everywhere(trained_run):
    greedy = cli("sample", trained_run, "--prime", "The ", "--length", "40", "--beam", "1", check_code=0).stdout
    zero = cli("sample", trained_run, "--prime", "The ", "--length", "40", "--temperature", "0", check_code=0)
    assert zero.stdout == greedy and "seed" not in zero.stderr  # no seed drawn: nothing is drawn
    model = charlm.load(trained_run, device="cpu")
    assert model.sample("The ", 40, temperature=0, seed=1) + "\n" == greedy
    assert model.sample("The ", 40, temperature=0, top_k=3, top_p=0.5, seed=2) + "\n" == greedy

    pytest.importorskip("fastapi", reason="the HTTP API needs the serve extra")
    from starlette.testclient import TestClient

    from charlm.config_inference import ServeConfig
    from charlm.serve.app import create_app

    client = TestClient(create_app({"tiny": model}, ServeConfig(), None))
    answer = client.post("/v1/sample", json={"prompt": "The ", "length": 40, "temperature": 0}).json()
    assert answer["samples"][0]["text"] + "\n" == greedy


def test_the_http_api_names_its_own_field_for_unknown_characters(trained_run):
    pytest.importorskip("fastapi", reason="the HTTP API needs the serve extra")
    from starlette.testclient import TestClient

    from charlm.config_inference import ServeConfig
    from charlm.serve.app import create_app

    client = TestClient(create_app({"tiny": charlm.load(trained_run, device="cpu")}, ServeConfig(), None))
    for path in ("/v1/score", "/v1/activations"):
        refused = client.post(path, json={"text": "ab\u00e9cd"})
        assert refused.status_code == 400 and refused.json() == {
            "error": "text has symbols outside the vocabulary: 'é' (the first at line 1, column 3); "
            'send "unknown": "skip" to leave them out'
        }
