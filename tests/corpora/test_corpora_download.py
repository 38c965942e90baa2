"""Downloads against a local HTTP server: caching, Range resume, retries, verification, failures."""

import hashlib
import socket

import pytest

from charlm.corpora.download import DownloadPolicy, RemoteFile, fetch
from charlm.errors import CharlmError

FAST = DownloadPolicy(attempts=3, backoff=0.0, timeout=5.0)
PAYLOAD = bytes(range(256)) * 400  # 102,400 bytes


def remote_for(server, path="payload.bin", data=PAYLOAD, **changes):
    server.files[path] = data
    expected = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), **changes}
    return RemoteFile(url=server.url(path), filename=path, **expected)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_good_download_is_verified_then_served_from_the_cache(corpus_server, tmp_path):
    remote = remote_for(corpus_server)
    path = fetch(remote, tmp_path, policy=FAST, progress=False)
    assert path == tmp_path / "payload.bin" and path.read_bytes() == PAYLOAD
    assert not (tmp_path / "payload.bin.part").exists()
    requests_before = len(corpus_server.requests)
    assert fetch(remote, tmp_path, policy=FAST, progress=False).read_bytes() == PAYLOAD
    assert len(corpus_server.requests) == requests_before  # no second download


def test_partial_download_is_resumed_with_a_range_request(corpus_server, tmp_path):
    remote = remote_for(corpus_server)
    (tmp_path / "payload.bin.part").write_bytes(PAYLOAD[:1000])
    path = fetch(remote, tmp_path, policy=FAST, progress=False)
    assert path.read_bytes() == PAYLOAD
    assert corpus_server.requests == [("payload.bin", "bytes=1000-")]


def test_server_that_ignores_range_gets_the_whole_file_again(corpus_server, tmp_path):
    remote = remote_for(corpus_server)
    corpus_server.honour_range = False
    (tmp_path / "payload.bin.part").write_bytes(b"stale bytes")
    assert fetch(remote, tmp_path, policy=FAST, progress=False).read_bytes() == PAYLOAD
    assert corpus_server.requests == [("payload.bin", "bytes=11-")]


def test_connection_closed_early_is_retried_and_resumed(corpus_server, tmp_path):
    remote = remote_for(corpus_server)
    corpus_server.cut_short["payload.bin"] = 1  # announces 102,400 bytes, sends half, closes
    messages = []
    path = fetch(remote, tmp_path, policy=FAST, progress=False, log=messages.append)
    assert path.read_bytes() == PAYLOAD
    assert corpus_server.requests[0] == ("payload.bin", None)
    assert corpus_server.requests[1][1].startswith("bytes=") and corpus_server.requests[1][1] != "bytes=0-"
    assert any("retrying" in message for message in messages)


def test_transfer_that_always_breaks_off_fails_and_keeps_the_partial_file(corpus_server, tmp_path):
    remote = remote_for(corpus_server)
    corpus_server.cut_short["payload.bin"] = 100
    with pytest.raises(CharlmError) as error:
        fetch(remote, tmp_path, policy=FAST, progress=False, log=lambda message: None)
    message = str(error.value)
    assert "broke off" in message and "after 3 attempts" in message and "--source" in message
    assert "\n" not in message
    assert (tmp_path / "payload.bin.part").exists() and not (tmp_path / "payload.bin").exists()


def test_checksum_mismatch_names_both_values_and_moves_the_file_aside(corpus_server, tmp_path):
    actual = hashlib.sha256(PAYLOAD).hexdigest()
    remote = remote_for(corpus_server, sha256="0" * 64)
    with pytest.raises(CharlmError) as error:
        fetch(remote, tmp_path, policy=FAST, progress=False)
    message = str(error.value)
    assert f"expected {'0' * 64}, got {actual}" in message
    aside = tmp_path / f"payload.bin.bad-{actual[:8]}"
    assert aside.read_bytes() == PAYLOAD and str(aside) in message
    assert not (tmp_path / "payload.bin").exists() and not (tmp_path / "payload.bin.part").exists()


def test_size_mismatch_is_reported(corpus_server, tmp_path):
    remote = remote_for(corpus_server, size=len(PAYLOAD) + 1)
    with pytest.raises(CharlmError, match=f"size: expected {len(PAYLOAD) + 1}, got {len(PAYLOAD)}"):
        fetch(remote, tmp_path, policy=FAST, progress=False)


def test_corrupted_cached_file_is_moved_aside_not_used(corpus_server, tmp_path):
    remote = remote_for(corpus_server)
    (tmp_path / "payload.bin").write_bytes(b"damaged")
    with pytest.raises(CharlmError, match="moved aside"):
        fetch(remote, tmp_path, policy=FAST, progress=False)
    assert list(tmp_path.glob("payload.bin.bad-*"))[0].read_bytes() == b"damaged"
    assert fetch(remote, tmp_path, policy=FAST, progress=False).read_bytes() == PAYLOAD  # fresh download


def test_no_verify_uses_the_file_with_a_warning(corpus_server, tmp_path):
    remote = remote_for(corpus_server, sha256="0" * 64)
    messages = []
    path = fetch(remote, tmp_path, verify=False, policy=FAST, progress=False, log=messages.append)
    assert path.read_bytes() == PAYLOAD
    assert any(message.startswith("warning: --no-verify") for message in messages)


def test_url_override_downloads_from_the_mirror(corpus_server, tmp_path):
    remote = remote_for(corpus_server, path="mirror/payload.bin")
    canonical = RemoteFile(f"http://127.0.0.1:{closed_port()}/payload.bin", "payload.bin", remote.size, remote.sha256)
    path = fetch(canonical, tmp_path, url=remote.url, policy=FAST, progress=False)
    assert path.read_bytes() == PAYLOAD


def test_not_found_is_a_clear_error_without_retries(corpus_server, tmp_path):
    remote = RemoteFile(corpus_server.url("missing.zip"), "missing.zip")
    with pytest.raises(CharlmError) as error:
        fetch(remote, tmp_path, policy=FAST, progress=False)
    assert "HTTP 404" in str(error.value) and "--source" in str(error.value)
    assert len(corpus_server.requests) == 1


def test_unreachable_host_says_how_to_pass_a_local_copy(tmp_path):
    remote = RemoteFile(f"http://127.0.0.1:{closed_port()}/text8.zip", "text8.zip")
    messages = []
    with pytest.raises(CharlmError) as error:
        fetch(
            remote,
            tmp_path,
            policy=DownloadPolicy(attempts=2, backoff=0.0, timeout=2.0),
            progress=False,
            log=messages.append,
        )
    message = str(error.value)
    assert message.startswith("cannot reach 127.0.0.1:") and "--source PATH" in message and "\n" not in message
    assert len(messages) == 1 and "retrying" in messages[0]


def test_policy_from_environment():
    policy = DownloadPolicy.from_environment({"CHARLM_DOWNLOAD_ATTEMPTS": "2", "CHARLM_DOWNLOAD_BACKOFF": "0.5"})
    assert policy.attempts == 2 and policy.backoff == 0.5 and policy.timeout == DownloadPolicy().timeout


@pytest.mark.parametrize(
    "name, value",
    [
        *[("CHARLM_DOWNLOAD_ATTEMPTS", value) for value in ("0", "-1", "101", "1e3", "nan", "", "many", str(2**64))],
        *[("CHARLM_DOWNLOAD_BACKOFF", value) for value in ("-1", "nan", "inf", "1e308", "3601", "")],
        *[("CHARLM_DOWNLOAD_TIMEOUT", value) for value in ("0", "-1", "nan", "inf", "1e308", "86401", "")],
    ],
)
def test_policy_from_environment_is_bounded(name, value):
    """Each is a number of its kind within bounds (time.sleep and socket timeouts refuse NaN, negative
    and huge values with a traceback), refused in one line naming the variable; 0 attempts is no longer 1."""
    with pytest.raises(CharlmError) as error:
        DownloadPolicy.from_environment({name: value})
    assert str(error.value).startswith(f"{name} must be ") and str(error.value).endswith(f"not {value!r}")


def test_the_wait_between_attempts_doubles_up_to_an_hour(monkeypatch, tmp_path):
    import charlm.corpora.download as download

    waits = []
    monkeypatch.setattr(download.time, "sleep", waits.append)
    remote = RemoteFile(f"http://127.0.0.1:{closed_port()}/text8.zip", "text8.zip")
    with pytest.raises(CharlmError):
        fetch(
            remote,
            tmp_path,
            policy=DownloadPolicy(attempts=100, backoff=3600.0, timeout=2.0),
            progress=False,
            log=lambda message: None,
        )
    assert waits[:2] == [3600.0, 3600.0] and len(waits) == 99 and max(waits) == 3600.0
