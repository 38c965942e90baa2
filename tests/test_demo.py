"""`charlm demo` runs the whole pipeline end to end on the embedded corpus (here on a short budget)."""

from helpers import cli


def test_demo_prepares_trains_evaluates_and_samples(tmp_path):
    result = cli("demo", "--minutes", "0.02", "--data-dir", tmp_path / "data", "--run-dir", tmp_path / "run",
                 check_code=0)
    assert "sample (400 characters after the prime" in result.stdout
    assert "\nThe " in result.stdout
    assert "test bpc" in result.stdout and "best valid bpc" in result.stdout
    assert (tmp_path / "data" / "pydoc" / "meta.json").is_file()
    assert (tmp_path / "run" / "best.pt").is_file()
