"""An exception charlm did not expect: one line and exit code 70 (EX_SOFTWARE); CHARLM_DEBUG=1 shows the traceback."""

import errno

import typer.main

import charlm.cli.app as app


def _raise(error):
    def fail(command):
        raise error

    return fail


def test_an_unexpected_exception_is_one_line_with_exit_code_70(monkeypatch, capsys):
    monkeypatch.delenv("CHARLM_DEBUG", raising=False)
    monkeypatch.setattr(typer.main, "get_command", _raise(RuntimeError("it broke\nbadly")))
    assert app.run(["cells"]) == app.INTERNAL_ERROR == 70
    err = capsys.readouterr().err
    assert err == ("charlm: internal error: RuntimeError: it broke badly (a bug; CHARLM_DEBUG=1 shows the traceback)\n")


def test_charlm_debug_shows_the_traceback(monkeypatch, capsys):
    monkeypatch.setenv("CHARLM_DEBUG", "1")
    monkeypatch.setattr(typer.main, "get_command", _raise(KeyError("x")))
    assert app.run(["cells"]) == 70
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):")
    assert err.endswith("charlm: internal error: KeyError: 'x' (a bug; CHARLM_DEBUG=1 shows the traceback)\n")


def test_an_oserror_is_one_line_naming_the_file(monkeypatch, capsys):
    monkeypatch.setattr(typer.main, "get_command", _raise(OSError(errno.EIO, "Input/output error", "some/file")))
    assert app.run(["cells"]) == 1
    assert capsys.readouterr().err == "charlm: error: cannot access some/file: Input/output error\n"
    monkeypatch.setattr(typer.main, "get_command", _raise(FileNotFoundError(errno.ENOENT, "No such file", "gone")))
    assert app.run(["cells"]) == 2
    assert capsys.readouterr().err == "charlm: error: cannot access gone: No such file\n"
