"""Memory bound: a 100-million-character text8 is prepared in under 1 GB (about 7 s)."""

import resource
import subprocess
import sys
import zipfile


def test_text8_of_100_million_characters_needs_less_than_1_gb(shared_corpora, tmp_path):
    prefix = (shared_corpora / "text8" / "text8.prefix-10M.txt").read_bytes()
    archive = tmp_path / "text8.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zip_file:
        zip_file.writestr("text8", prefix * 10)
    script = (
        "from charlm.corpora import prepare_corpus; "
        f"c = prepare_corpus('text8', source={str(archive)!r}, verify=False, data_dir={str(tmp_path)!r}, "
        "progress=False, log=lambda m: None); "
        "print(c.tokens('train'), c.tokens('valid'), c.tokens('test'), c.vocab_size)"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["90000000", "5000000", "5000000", "27"]
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert peak_kib < 1_000_000, f"peak resident memory {peak_kib / 1024:.0f} MiB"
