"""`charlm prepare` and `charlm corpora`: results on stdout, one-line errors, exit code 2.

Every error path runs through the real entry point, ``charlm.cli.app.main``, in-process; the
success path and the errors of each input kind (download, local text, usage) also run as
``python -m charlm`` subprocesses. A subprocess costs the interpreter's start-up (seconds, since
the CLI imports torch), so they are kept few.
"""

import os
import socket
import subprocess
import sys

import pytest
from conftest import SHARED_CORPORA_DIR, CorpusServer

from charlm.cli.app import main

FAKE_WP = b"Not War and Peace at all.\n" * 1000

ERROR_CASES = {
    "unknown corpus": (["prepare", "nope"], "unknown corpus 'nope': known corpora are ptb"),
    "missing source": (["prepare", "wp", "--source", "{tmp}/nowhere.txt"], "nowhere.txt does not exist"),
    "checksum mismatch": (
        ["prepare", "wp", "--url", "{server}/warpeace_input.txt"],
        "does not match: size: expected 3258246, got 26000; sha256: expected fb66ba99",
    ),
    "not found": (["prepare", "wp", "--url", "{server}/missing.txt"], "HTTP 404"),
    "unreachable": (["prepare", "text8", "--url", "http://127.0.0.1:{closed}/text8.zip"], "cannot reach 127.0.0.1"),
    "not utf-8": (["prepare", "text", "{tmp}/latin1.txt", "--name", "bad"], "latin1.txt is not UTF-8 text"),
    "split of a built-in": (["prepare", "ptb", "--split", "0.8,0.1,0.1"], "ptb has a fixed split"),
    "bad split": (["prepare", "text", "{tmp}/prose.txt", "--name", "x", "--split", "a,b"], "--split wants"),
    "split of nan": (
        ["prepare", "text", "{tmp}/prose.txt", "--name", "x", "--split", "nan,0.5,0.5"],
        "--split wants three positive fractions that sum to 1 (train,valid,test), not (nan, 0.5, 0.5)",
    ),
    "name of a built-in": (
        ["prepare", "text", "{tmp}/prose.txt", "--name", "pydoc"],
        "'pydoc' is a built-in corpus (Python's own documentation, offline): choose another --name, or pass --force",
    ),
    "built-in under another's name": (["prepare", "pydoc", "--name", "wp"], "'wp' is a built-in corpus"),
    "text without name": (["prepare", "text", "{tmp}/prose.txt"], "needs --name NAME"),
    "corrupt archive": (["prepare", "ptb", "--source", "{tmp}/simple-examples.tgz"], "corrupt or truncated archive"),
    "unknown symbols": (
        ["prepare", "text", "{tmp}/novel.txt", "--name", "novel"],
        "the test split has symbols that the training split lacks: '!'",
    ),
}
SUBPROCESS_CASES = ("checksum mismatch", "not utf-8")
ENVIRONMENT = {"CHARLM_DOWNLOAD_ATTEMPTS": "1", "CHARLM_DOWNLOAD_BACKOFF": "0"}


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    """Input files, a local server with a fake War and Peace, and a closed port."""
    tmp = tmp_path_factory.mktemp("cli")
    (tmp / "latin1.txt").write_bytes("naïve\n".encode("latin-1") * 100)
    (tmp / "prose.txt").write_text("Some prose to split.\n" * 100, encoding="utf-8")
    (tmp / "novel.txt").write_text("Some prose to split.\n" * 100 + "The end!", encoding="utf-8")
    (tmp / "simple-examples.tgz").write_bytes(b"\x1f\x8b" + b"\x00" * 100)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    server = CorpusServer()
    server.files["warpeace_input.txt"] = FAKE_WP
    server.thread.start()
    yield {"tmp": tmp, "server": server.url("")[:-1], "closed": closed}
    server.httpd.shutdown()
    server.httpd.server_close()


def arguments_of(case, setting, data_dir):
    arguments = [a.format(**setting) for a in ERROR_CASES[case][0]]
    return arguments + ["--quiet", "--data-dir", str(data_dir)]


def run_in_process(arguments, monkeypatch, capsys):
    for key, value in ENVIRONMENT.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "argv", ["charlm", *arguments])
    with pytest.raises(SystemExit) as exit_:
        main()
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


def run_subprocess(arguments):
    result = subprocess.run(
        [sys.executable, "-m", "charlm", *arguments],
        capture_output=True,
        text=True,
        env={**os.environ, **ENVIRONMENT, "COLUMNS": "160"},
        timeout=120,
    )
    return result.returncode, result.stdout, result.stderr


def assert_one_line_error(code, out, err, expected):
    assert code == 2, err
    assert "Traceback" not in err and out == ""
    assert err.count("\n") == 1 and err.startswith("charlm: error: "), err
    assert expected in err


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_error_is_one_line_and_exit_code_2(case, setting, tmp_path, monkeypatch, capsys):
    code, out, err = run_in_process(arguments_of(case, setting, tmp_path), monkeypatch, capsys)
    assert_one_line_error(code, out, err, ERROR_CASES[case][1])


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_error_from_a_subprocess(case, setting, tmp_path):
    assert_one_line_error(*run_subprocess(arguments_of(case, setting, tmp_path)), ERROR_CASES[case][1])


def test_force_prepares_text_under_a_built_in_name_and_the_listing_describes_it(setting, tmp_path, monkeypatch, capsys):
    """Issue 34: `--name pydoc` silently replaced the built-in corpus, still listed as Python's documentation."""
    arguments = [
        "prepare",
        "text",
        f"{setting['tmp']}/prose.txt",
        "--name",
        "pydoc",
        "--force",
        "--quiet",
        "--data-dir",
        str(tmp_path),
    ]
    code, out, err = run_in_process(arguments, monkeypatch, capsys)
    assert code == 0 and out.startswith("pydoc: "), err
    code, listing, err = run_in_process(["corpora", "--data-dir", str(tmp_path)], monkeypatch, capsys)
    row = next(line for line in listing.splitlines() if line.strip("│ ").startswith("pydoc "))
    assert code == 0 and "yes" in row and "Python" not in row and "your text" in row


def test_checksum_mismatch_moves_the_download_aside(setting, tmp_path, monkeypatch, capsys):
    run_in_process(arguments_of("checksum mismatch", setting, tmp_path), monkeypatch, capsys)
    assert [p.name[:-8] for p in (tmp_path / "downloads").iterdir()] == ["warpeace_input.txt.bad-"]
    assert not (tmp_path / "wp").exists()


def test_no_verify_uses_a_modified_download_with_a_warning(setting, tmp_path, monkeypatch, capsys):
    arguments = [
        "prepare",
        "wp",
        "--url",
        f"{setting['server']}/warpeace_input.txt",
        "--no-verify",
        "--quiet",
        "--data-dir",
        str(tmp_path),
    ]
    code, out, err = run_in_process(arguments, monkeypatch, capsys)
    assert code == 0 and "warning: --no-verify" in err and out.startswith("wp: ")


def test_prepare_then_again_then_list_as_subprocesses(tmp_path):
    if not SHARED_CORPORA_DIR.is_dir():
        pytest.skip(f"the reference corpora are not at {SHARED_CORPORA_DIR}")
    prepare = ["prepare", "ptb", "--source", str(SHARED_CORPORA_DIR / "ptb"), "--data-dir", str(tmp_path)]
    code, out, err = run_subprocess(prepare)
    assert code == 0, err
    assert (
        out == f"ptb: 5,017,482 / 393,042 / 442,423 tokens (train / valid / test), char vocabulary 50, "
        f"in {tmp_path / 'ptb'}\n"
    )
    assert "ptb: reading" in err
    code, again, err = run_subprocess(prepare)
    assert code == 0 and again == out and "already prepared" in err and "nothing to do" in err
    code, listing, err = run_subprocess(["corpora", "--data-dir", str(tmp_path)])
    assert code == 0, err
    row = next(line for line in listing.splitlines() if line.strip("│ ").startswith("ptb "))
    assert "yes" in row and "5,017,482" in row and "442,423" in row and " 50 " in row


def test_corpora_fit_80_columns(tiny_corpus):
    """Issue 34: at COLUMNS=80 (a real process: charlm's console reads it at start) the split sizes
    go before the corpus, whether it is prepared and what it is; the description wraps with room."""
    from charlm.corpora import load_corpus
    from helpers import assert_fits, run_cli, table_header, table_lines

    result = run_cli("corpora", "--data-dir", tiny_corpus, env={"COLUMNS": "80"}, check_code=0)
    assert_fits(result.stdout)
    header = table_header(result.stdout)
    assert header[:2] == ["corpus", "prepared"] and header[-1] == "description" and "valid" not in header
    tiny = next(line for line in table_lines(result.stdout) if line[0] == "tiny")
    if "train" in header:  # whole, on the row's line
        assert tiny[header.index("train")] == f"{load_corpus('tiny', tiny_corpus).tokens('train'):,}"
    description = next(line for line in result.stdout.splitlines() if line.startswith("┃")).split("┃")[-2]
    assert len(description) >= 2 + 24  # the description wraps in 24 columns or more, not a word a line
