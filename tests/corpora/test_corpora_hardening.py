"""Hostile and broken inputs to `charlm prepare`: malicious archives, bad --url values, failing mirrors,
preparations killed half-way, and corpora prepared without verification. Every bad input is built here.
"""

import gzip
import hashlib
import io
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import replace

import pytest
from helpers import cli

from charlm.corpora import RECIPES, DownloadPolicy, load_corpus, prepare_corpus
from charlm.corpora.sources import BoundedReader, SizeLimits
from charlm.corpora.store import STAGING_NAME, staging_path
from charlm.errors import CharlmError

FAST = DownloadPolicy(attempts=1, backoff=0.0, timeout=5.0)
PTB_DIR = "./simple-examples/data/"
PTB_CHAR = {f"ptb.char.{split}.txt": b"a b _ c \n b _ a \n " * 50 for split in ("train", "valid", "test")}
GIB = 1 << 30


@pytest.fixture(autouse=True)
def one_download_attempt(monkeypatch):
    monkeypatch.setenv("CHARLM_DOWNLOAD_ATTEMPTS", "1")
    monkeypatch.setenv("CHARLM_DOWNLOAD_BACKOFF", "0")


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("charlm: error: "), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, f"{fragment!r} not in {result.stderr!r}"


def assert_nothing_prepared(data_dir):
    """No corpus and no temporary directory: at most the download cache."""
    left = sorted(path.name for path in data_dir.iterdir()) if data_dir.exists() else []
    assert left in ([], ["downloads"]), left


def small_ptb():
    """The ptb recipe, its member checksums those of the small PTB_CHAR files."""
    recipe = RECIPES["ptb"]
    checksums = {name: hashlib.sha256(data).hexdigest() for name, data in PTB_CHAR.items()}
    return replace(recipe, inputs=replace(recipe.inputs, member_sha256=checksums))


def with_limits(recipe, member, total):
    return replace(recipe, inputs=replace(recipe.inputs, limits=SizeLimits(member=member, total=total)))


# --- building archives ---------------------------------------------------------------------------


def tar_gz(entries) -> bytes:
    """A .tar.gz of ``entries``: (TarInfo, data or None) pairs, the TarInfo's size set from the data."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, data in entries:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def regular(name: str, data: bytes):
    return tarfile.TarInfo(name), data


def special(name: str, kind: bytes, linkname: str = ""):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info, None


def genuine_ptb_members():
    return [regular(PTB_DIR + name, data) for name, data in PTB_CHAR.items()]


def tar_header_declaring(name: str, size: int) -> bytes:
    """A .tar.gz whose only header says ``size`` bytes follow, though a kilobyte does."""
    info = tarfile.TarInfo(name)
    info.size = size
    return gzip.compress(info.tobuf() + b"x" * 1024 + bytes(2 * tarfile.BLOCKSIZE))


def zip_declaring(member: str, data: bytes, declared: int) -> bytes:
    """A zip of ``data`` whose headers (local and central) say the member inflates to ``declared`` bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(member, data)
    raw = bytearray(buffer.getvalue())
    central = raw.index(b"PK\x01\x02")
    raw[central + 24 : central + 28] = struct.pack("<I", declared)
    raw[22:26] = struct.pack("<I", declared)
    return bytes(raw)


# --- 1. archives: sizes ---------------------------------------------------------------------------


def test_tar_header_declaring_1e11_bytes_is_refused_before_reading(corpus_server, tmp_path):
    corpus_server.files["simple-examples.tgz"] = tar_header_declaring(PTB_DIR + "ptb.char.train.txt", 10**11)
    result = cli("prepare", "ptb", "--url", corpus_server.url("simple-examples.tgz"), "--quiet", "--data-dir", tmp_path)
    assert_one_line_error(
        result,
        "member simple-examples/data/ptb.char.train.txt is 100,000,000,000 bytes long, "
        "more than the 20,069,928 this corpus allows; refused without reading it",
        "moved aside",
    )
    assert_nothing_prepared(tmp_path)
    assert len(list((tmp_path / "downloads").glob("simple-examples.tgz.bad-*"))) == 1


def test_zip_bomb_declaring_4_gib_is_refused_before_reading(tmp_path):
    bomb = tmp_path / "simple-examples.zip"
    bomb.write_bytes(zip_declaring("simple-examples/data/ptb.char.train.txt", b"a \n " * 100, 4 * GIB - 16))
    assert bomb.stat().st_size < 1000
    result = cli("prepare", "ptb", "--source", bomb, "--quiet", "--data-dir", tmp_path / "data")
    assert_one_line_error(
        result,
        f"{bomb}: member simple-examples/data/ptb.char.train.txt is 4,294,967,280 bytes "
        "long, more than the 20,069,928 this corpus allows; refused without reading it",
    )
    assert_nothing_prepared(tmp_path / "data")


def test_compressible_member_over_the_limit_is_refused(tmp_path):
    bomb = tmp_path / "text8.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("text8", b"a " * 1_000_000)
    assert bomb.stat().st_size < 10_000
    recipe = with_limits(RECIPES["text8"], member=100_000, total=100_000)
    with pytest.raises(
        CharlmError,
        match="member text8 is 2,000,000 bytes long, more than the 100,000 this corpus "
        "allows; refused without reading it",
    ):
        prepare_corpus(
            recipe, source=bomb, verify=False, data_dir=tmp_path / "data", progress=False, log=lambda message: None
        )
    assert_nothing_prepared(tmp_path / "data")


def test_zip_member_inflating_past_its_declared_size_stops_there(tmp_path):
    liar = tmp_path / "text8.zip"
    liar.write_bytes(zip_declaring("text8", bytes(2_000_000), 1000))  # 2 MB of zeros, said to be 1,000 bytes
    corrupt = r"text8.zip is a corrupt or truncated archive \(Bad CRC-32 for file 'text8'\)"
    with pytest.raises(CharlmError, match=corrupt):
        prepare_corpus(
            "text8", source=liar, verify=False, data_dir=tmp_path / "data", progress=False, log=lambda message: None
        )
    assert_nothing_prepared(tmp_path / "data")


def test_reader_stops_a_stream_that_holds_more_or_less_than_it_declares(tmp_path):
    reader = BoundedReader(tmp_path / "source.zip", SizeLimits(member=100, total=100))
    with pytest.raises(CharlmError, match="member m holds more than the 10 bytes it declares; refused"):
        reader.read(io.BytesIO(b"x" * 5_000), "member m", 10)
    with pytest.raises(CharlmError, match="member m ends after 5 of the 10 bytes it declares"):
        reader.read(io.BytesIO(b"x" * 5), "member m", 10)
    assert reader.read(io.BytesIO(b"x" * 10), "member m", 10) == b"x" * 10


def test_members_together_over_the_total_limit_are_refused(tmp_path):
    reviews = [
        regular(f"aclImdb/{part}/pos/{i}_7.txt", b"A fine film. " * 50) for part in ("train", "test") for i in range(5)
    ]
    archive = tmp_path / "aclImdb_v1.tar.gz"
    archive.write_bytes(tar_gz(reviews))
    recipe = with_limits(RECIPES["imdb-subword"], member=1_000, total=5_000)
    with pytest.raises(
        CharlmError,
        match="the files this corpus reads hold more than the 5,000 bytes it allows in all "
        r"\(at member aclImdb/test/pos/2_7.txt\); refused",
    ):
        prepare_corpus(
            recipe, source=archive, verify=False, data_dir=tmp_path / "data", progress=False, log=lambda message: None
        )


def test_local_file_over_the_limit_is_refused_without_reading(tmp_path):
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "warpeace_input.txt").write_bytes(b"War. " * 2_000)
    recipe = with_limits(RECIPES["wp"], member=5_000, total=5_000)
    for source in (tmp_path / "copy", tmp_path / "copy" / "warpeace_input.txt"):
        with pytest.raises(CharlmError, match="file warpeace_input.txt is 10,000 bytes long, more than the 5,000"):
            prepare_corpus(
                recipe,
                source=source,
                verify=False,
                data_dir=tmp_path / "data",
                progress=False,
                log=lambda message: None,
            )


def test_recipe_limits_leave_room_for_the_genuine_corpora():
    assert RECIPES["text8"].inputs.limits.member >= 2 * 100_000_000
    assert RECIPES["enwik8"].inputs.limits.member >= 2 * 100_000_000
    assert RECIPES["ptb"].inputs.limits.total >= 2 * 11_705_894
    assert RECIPES["wp"].inputs.limits.member >= 2 * 3_258_246


# --- 1. archives: paths and file types ------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["../../escaped/ptb.char.train.txt", "/tmp/escaped/ptb.char.train.txt", "simple-examples/../../ptb.char.train.txt"],
)
def test_wanted_member_with_an_unsafe_path_is_refused(name, tmp_path):
    archive = tmp_path / "simple-examples.tgz"
    archive.write_bytes(tar_gz([regular(name, PTB_CHAR["ptb.char.train.txt"])]))
    result = cli("prepare", "ptb", "--source", archive, "--quiet", "--data-dir", tmp_path / "data")
    assert_one_line_error(
        result, f"member {name!r} has an absolute path or one with '..'; refused as damaged or malicious"
    )
    assert_nothing_prepared(tmp_path / "data")
    assert not (tmp_path.parent / "escaped").exists()


@pytest.mark.parametrize(
    "kind, linkname, what",
    [
        (tarfile.SYMTYPE, "/etc/passwd", "a symbolic link to '/etc/passwd'"),
        (
            tarfile.LNKTYPE,
            "simple-examples/data/ptb.char.valid.txt",
            "a hard link to 'simple-examples/data/ptb.char.valid.txt'",
        ),
        (tarfile.CHRTYPE, "", "a device"),
        (tarfile.BLKTYPE, "", "a device"),
        (tarfile.FIFOTYPE, "", "a FIFO"),
    ],
)
def test_wanted_tar_member_that_is_not_a_regular_file_is_refused(kind, linkname, what, tmp_path):
    members = genuine_ptb_members()
    members[0] = special(PTB_DIR + "ptb.char.train.txt", kind, linkname)
    archive = tmp_path / "simple-examples.tgz"
    archive.write_bytes(tar_gz(members))
    result = cli("prepare", "ptb", "--source", archive, "--quiet", "--data-dir", tmp_path / "data")
    assert_one_line_error(result, f"member '{PTB_DIR}ptb.char.train.txt' is {what}, not a regular file; refused")
    assert_nothing_prepared(tmp_path / "data")


def test_wanted_zip_member_that_is_a_symbolic_link_is_refused(tmp_path):
    archive = tmp_path / "text8.zip"
    with zipfile.ZipFile(archive, "w") as zip_file:
        link = zipfile.ZipInfo("text8")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        zip_file.writestr(link, "/etc/passwd")
    with pytest.raises(CharlmError, match="member 'text8' is a symbolic link, not a regular file; refused"):
        prepare_corpus(
            "text8", source=archive, verify=False, data_dir=tmp_path / "data", progress=False, log=lambda message: None
        )


def test_unwanted_malicious_members_are_never_touched(tmp_path):
    hostile = [
        regular("../../escaped.txt", b"outside"),
        regular("/tmp/escaped-absolute.txt", b"outside"),
        special("simple-examples/link", tarfile.SYMTYPE, "/etc/passwd"),
        special("simple-examples/hard", tarfile.LNKTYPE, "../../../etc/passwd"),
        special("simple-examples/fifo", tarfile.FIFOTYPE),
    ]
    archive = tmp_path / "simple-examples.tgz"
    archive.write_bytes(tar_gz(hostile + genuine_ptb_members()))
    corpus = prepare_corpus(small_ptb(), source=archive, data_dir=tmp_path / "data", progress=False)
    assert corpus.tokens("train") == 50 * len("ab_c\nb_a\n")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["data", "simple-examples.tgz"]
    assert not (tmp_path.parent / "escaped.txt").exists()


# --- 2. --url must be http(s) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    ["file:///etc/passwd", "not a url", "ftp://example.org/text8.zip", "http://", "http://127.0.0.1:port/text8.zip"],
)
def test_url_that_is_not_http_is_refused(url, tmp_path):
    result = cli("prepare", "text8", "--url", url, "--quiet", "--data-dir", tmp_path)
    assert_one_line_error(
        result,
        f"cannot download from {url!r}: only http:// and https:// addresses are accepted; "
        "for a file on this machine use --source PATH",
    )
    assert list(tmp_path.iterdir()) == []


# --- 3. a failing mirror is named -----------------------------------------------------------------


def test_checksum_mismatch_names_the_mirror(corpus_server, tmp_path):
    corpus_server.files["mirror/warpeace_input.txt"] = b"Not War and Peace.\n" * 100
    mirror = corpus_server.url("mirror/warpeace_input.txt")
    result = cli("prepare", "wp", "--url", mirror, "--quiet", "--data-dir", tmp_path)
    assert_one_line_error(result, f"warpeace_input.txt downloaded from {mirror} does not match: size: expected 3258246")
    assert "stanford.edu" not in result.stderr


def test_archive_with_modified_members_names_the_mirror(corpus_server, tmp_path):
    corpus_server.files["mirror/simple-examples.tgz"] = tar_gz(genuine_ptb_members())
    mirror = corpus_server.url("mirror/simple-examples.tgz")
    result = cli("prepare", "ptb", "--url", mirror, "--quiet", "--data-dir", tmp_path)
    assert_one_line_error(
        result,
        f"simple-examples.tgz downloaded from {mirror} holds files that differ from the "
        "published corpus: ptb.char.train.txt sha256: expected e313d914",
    )
    assert "vutbr.cz" not in result.stderr


def test_unreachable_mirror_is_named(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mirror = f"http://127.0.0.1:{port}/mirror/text8.zip"
    result = cli("prepare", "text8", "--url", mirror, "--quiet", "--data-dir", tmp_path)
    assert_one_line_error(
        result, f"cannot reach 127.0.0.1:{port}", "after 1 attempt.", f"Download {mirror} another way"
    )
    assert "mattmahoney" not in result.stderr


# --- 4. preparations killed half-way --------------------------------------------------------------

KILLED_PREPARE = """
import os, signal, sys
from charlm.corpora import prepare_corpus, store

real_write = store.write_array
def write_then_die(path, array):
    real_write(path, array)
    os.kill(os.getpid(), signal.SIGKILL)

store.write_array = write_then_die
prepare_corpus("text", paths=[sys.argv[1]], output_name="fox", data_dir=sys.argv[2], progress=False)
"""

KILLED_BETWEEN_RENAMES = """
import os, signal, sys
from charlm.corpora import prepare_corpus

real_replace, calls = os.replace, []
def replace_then_die(source, target):
    calls.append(source)
    if len(calls) == 2:  # the old version is moved aside, the new one not yet in place
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(source, target)

os.replace = replace_then_die
prepare_corpus("text", paths=[sys.argv[1]], output_name="fox", data_dir=sys.argv[2], progress=False)
"""


def run_killed(script, text, data_dir):
    result = subprocess.run(
        [sys.executable, "-c", script, str(text), str(data_dir)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == -signal.SIGKILL, result.stderr


@pytest.fixture
def prose(tmp_path):
    path = tmp_path / "prose.txt"
    path.write_text("The quick brown fox jumps over the lazy dog.\n" * 300, encoding="utf-8")
    return path


def test_prepare_killed_while_writing_is_cleaned_up_by_the_next(prose, tmp_path):
    data = tmp_path / "data"
    run_killed(KILLED_PREPARE, prose, data)
    [partial] = list(data.glob(".fox.partial-*"))
    assert (partial / "train.npy").exists() and not (data / "fox").exists()
    messages = []
    corpus = prepare_corpus("text", paths=[prose], output_name="fox", data_dir=data, log=messages.append)
    assert sorted(path.name for path in data.iterdir()) == ["fox"]
    assert corpus.tokens("train") == 45 * 300 - 2 * 675 and corpus.tokenizer.decode(corpus.split("valid")[:4]) == "The "
    assert f"removed {partial.name}, left in {data} by a preparation that was killed" in messages


def test_prepare_killed_between_the_renames_puts_the_old_version_back(prose, tmp_path):
    data = tmp_path / "data"
    first = prepare_corpus("text", paths=[prose], output_name="fox", data_dir=data, progress=False)
    original = prose.read_text()
    prose.write_text(original + "The lazy dog.\n", encoding="utf-8")
    run_killed(KILLED_BETWEEN_RENAMES, prose, data)
    assert not (data / "fox").exists() and len(list(data.glob(".fox.previous-*"))) == 1
    prose.write_text(original, encoding="utf-8")
    messages = []
    again = prepare_corpus("text", paths=[prose], output_name="fox", data_dir=data, log=messages.append)
    assert sorted(path.name for path in data.iterdir()) == ["fox"]
    assert again.meta["fingerprint"] == first.meta["fingerprint"]
    assert any(message.startswith("put back .fox.previous-") for message in messages)
    assert any("nothing to do" in message for message in messages)


def test_only_the_staging_of_dead_processes_on_this_host_is_removed(prose, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    dead = int(finished.stdout)

    def staging(name, pid, host=None):
        path = staging_path(data, name, "partial")
        parts = STAGING_NAME.fullmatch(path.name)
        path = path.with_name(
            path.name.replace(f"-{parts['host']}-{parts['pid']}-", f"-{host or parts['host']}-{pid}-")
        )
        path.mkdir()
        (path / "train.npy").write_bytes(b"half written")
        return path

    stale = [staging("fox", dead), staging("other", dead)]
    kept = [
        staging("fox", os.getpid()),
        staging("fox", dead, host="another-machine"),
        data / ".fox.partial-0123abcd",
    ]  # an older charlm's name: its process is unknown
    kept[-1].mkdir()
    prepare_corpus("text", paths=[prose], output_name="fox", data_dir=data, progress=False)
    assert not any(path.exists() for path in stale)
    assert all(path.exists() for path in kept)
    assert load_corpus("fox", data).tokens("valid") == 675


# --- 5. unverified corpora are marked -------------------------------------------------------------


def corpora_row(data_dir, name):
    listing = cli("corpora", "--data-dir", data_dir, check_code=0).stdout
    return next(line for line in listing.splitlines() if line.strip("│ ").startswith(f"{name} "))


def test_listing_marks_a_corpus_prepared_without_verification(prose, tmp_path):
    data = tmp_path / "data"
    text8 = tmp_path / "text8"
    text8.write_bytes(b" anarchism originated as a term of abuse" * 500)
    result = cli("prepare", "text8", "--source", text8, "--no-verify", "--quiet", "--data-dir", data, check_code=0)
    assert "warning: using a modified local copy" in result.stderr
    cli("prepare", "text", prose, "--name", "fox", "--quiet", "--data-dir", data, check_code=0)
    assert "yes, unverified" in corpora_row(data, "text8") and load_corpus("text8", data).verified is False
    assert "unverified" not in corpora_row(data, "fox") and " yes " in corpora_row(data, "fox")


def test_listing_reads_metadata_without_the_verified_field(prose, tmp_path):
    data = tmp_path / "data"
    prepare_corpus("text", paths=[prose], output_name="fox", data_dir=data, progress=False)
    meta = data / "fox" / "meta.json"
    meta.write_text(meta.read_text(encoding="utf-8").replace('"verified": true,', ""), encoding="utf-8")
    assert "verified" not in meta.read_text(encoding="utf-8")
    assert load_corpus("fox", data).verified is True
    row = corpora_row(data, "fox")
    assert " yes " in row and "unverified" not in row
