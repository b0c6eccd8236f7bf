"""The model file server over real HTTP on loopback: what it serves, what it refuses, and that
a rank going away or several ranks at once cost nothing but bandwidth."""

from __future__ import annotations

import http.client
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest

from cluster.files.file_server import ModelFileServer
from topology.errors import InputError

TOKEN = "s3cret-launch-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RAW_GET = (
    f"GET /files/big.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode()
)


def _can_bind(address: str) -> bool:
    # 127.0.0.2 answers on Linux's lo; macOS has only 127.0.0.1 unless an alias was added.
    with socket.socket() as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


def _hostport(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def _request(
    url: str, method: str, path: str, headers: Mapping[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    host, port = _hostport(url)
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request(method, path, headers=dict(headers or {}))
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


@pytest.fixture
def model(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "weights.safetensors").write_bytes(os.urandom(3 << 20))
    (folder / "config.json").write_text('{"model_type": "tiny"}')
    (folder / "secret.txt").write_text("not part of the model")  # same folder, not served
    return {n: (folder / n).resolve() for n in ("weights.safetensors", "config.json")}


def _eventually(check: Callable[[], bool], within_s: float = 5.0) -> bool:
    """The server counts and logs a response once it is sent: the client may be faster."""
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def server(model: dict[str, Path]) -> Iterator[ModelFileServer]:
    with ModelFileServer(model, TOKEN, ["127.0.0.1"]) as s:
        yield s


def test_full_get_is_the_file(server: ModelFileServer, model: dict[str, Path]) -> None:
    for name, path in model.items():
        status, headers, body = _request(server.urls[0], "GET", f"/files/{quote(name)}", AUTH)
        assert status == 200
        assert body == path.read_bytes()
        assert headers["Content-Length"] == str(path.stat().st_size)
    sizes = {n: p.stat().st_size for n, p in model.items()}
    assert _eventually(lambda: server.served_bytes() == sizes), server.served_bytes()
    assert _eventually(lambda: [r[2] for r in server.requests] == [200, 200]), server.requests


def test_keep_alive_serves_several_files_on_one_connection(
    server: ModelFileServer, model: dict[str, Path]
) -> None:
    conn = http.client.HTTPConnection(*_hostport(server.urls[0]), timeout=10)
    for _ in range(2):
        for name, path in model.items():
            conn.request("GET", f"/files/{name}", headers=AUTH)
            resp = conn.getresponse()
            assert resp.status == 200 and resp.read() == path.read_bytes()
    conn.close()


def test_range_resumes(server: ModelFileServer, model: dict[str, Path]) -> None:
    data = model["weights.safetensors"].read_bytes()
    size = len(data)
    url, path = server.urls[0], "/files/weights.safetensors"
    status, headers, body = _request(url, "GET", path, {**AUTH, "Range": "bytes=1000-"})
    assert (status, body) == (206, data[1000:])
    assert headers["Content-Range"] == f"bytes 1000-{size - 1}/{size}"
    assert headers["Content-Length"] == str(size - 1000)
    status, headers, body = _request(url, "GET", path, {**AUTH, "Range": "bytes=10-19"})
    assert (status, body, headers["Content-Range"]) == (206, data[10:20], f"bytes 10-19/{size}")
    # An end past the file is cut to the file, as HTTP says.
    status, headers, body = _request(
        url, "GET", path, {**AUTH, "Range": f"bytes={size - 5}-{size * 2}"}
    )
    assert (status, body) == (206, data[-5:])
    assert _eventually(lambda: ("weights.safetensors", "bytes=1000-", 206) in server.requests)


def test_head_gives_headers_only(server: ModelFileServer, model: dict[str, Path]) -> None:
    size = model["weights.safetensors"].stat().st_size
    status, headers, body = _request(server.urls[0], "HEAD", "/files/weights.safetensors", AUTH)
    assert (status, body, headers["Content-Length"]) == (200, b"", str(size))
    status, headers, body = _request(
        server.urls[0], "HEAD", "/files/weights.safetensors", {**AUTH, "Range": "bytes=7-"}
    )
    assert (status, body, headers["Content-Range"]) == (206, b"", f"bytes 7-{size - 1}/{size}")
    assert server.served_bytes() == {}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
        {"Authorization": "Bearer "},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": "Bearer \xe9t\xe9"},
    ],
)
def test_token_is_required(server: ModelFileServer, headers: dict[str, str]) -> None:
    status, resp_headers, body = _request(server.urls[0], "GET", "/files/config.json", headers)
    assert status == 401
    assert resp_headers["Content-Type"] == "application/json" and b'"error"' in body
    # Checked before the name: an unknown name gets the same answer, so names can't be probed.
    assert _request(server.urls[0], "GET", "/files/nope", headers)[0] == 401
    assert server.served_bytes() == {}


def test_scheme_is_case_insensitive(server: ModelFileServer) -> None:
    for scheme in ("bearer", "BEARER", "Bearer"):
        headers = {"Authorization": f"{scheme} {TOKEN}"}
        assert _request(server.urls[0], "GET", "/files/config.json", headers)[0] == 200


@pytest.mark.parametrize(
    "path",
    [
        "/files/../../etc/passwd",
        "/files/%2e%2e%2f%2e%2e%2fetc%2fpasswd",
        "/files/%2e%2e%2fetc%2fpasswd",
        "/files/secret.txt",
        "/files//etc/passwd",
        "/files/%2Fetc%2Fpasswd",
        "/files/config.json/",
        "/files/config.json%00",
        "/files/./config.json",
        "/files/CONFIG.JSON",
        "/files/%252e%252e%252fetc%252fpasswd",
        "/files/",
        "/files",
        "/",
        "/etc/passwd",
        "/config.json",
    ],
)
def test_only_the_dict_is_served(server: ModelFileServer, path: str) -> None:
    status, headers, body = _request(server.urls[0], "GET", path, AUTH)
    assert status == 404
    assert headers["Content-Type"] == "application/json" and b"root:" not in body
    assert server.served_bytes() == {}


def test_absolute_path_of_a_served_file_is_not_a_name(
    server: ModelFileServer, model: dict[str, Path]
) -> None:
    absolute = str(model["config.json"])
    for path in (f"/files/{quote(absolute, safe='')}", f"/files{absolute}"):
        assert _request(server.urls[0], "GET", path, AUTH)[0] == 404
    assert server.served_bytes() == {}


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "FOO"])
def test_read_only(server: ModelFileServer, method: str) -> None:
    status, headers, body = _request(server.urls[0], method, "/files/config.json", AUTH)
    assert status == 405
    assert headers["Allow"] == "GET, HEAD" and b'"error"' in body


@pytest.mark.parametrize(
    ("range_header", "status"),
    [
        ("bytes=abc-", 400),
        ("bytes=5-2", 400),
        ("bytes=0-1,5-6", 400),
        ("bytes=-5", 400),
        ("items=0-", 400),
        ("bytes=999999999-", 416),
    ],
)
def test_bad_range(server: ModelFileServer, range_header: str, status: int) -> None:
    got, headers, body = _request(
        server.urls[0], "GET", "/files/config.json", {**AUTH, "Range": range_header}
    )
    assert got == status and b'"error"' in body
    if status == 416:
        size = len('{"model_type": "tiny"}')
        assert headers["Content-Range"] == f"bytes */{size}"


def test_the_file_as_it_is_now(server: ModelFileServer, model: dict[str, Path]) -> None:
    model["config.json"].write_text('{"changed": true}')
    assert _request(server.urls[0], "GET", "/files/config.json", AUTH)[2] == b'{"changed": true}'
    model["config.json"].unlink()
    status, headers, _ = _request(server.urls[0], "GET", "/files/config.json", AUTH)
    assert status == 404 and headers["Content-Type"] == "application/json"


def test_percent_encoded_names(tmp_path: Path) -> None:
    odd = tmp_path / "a b+c%.json"
    odd.write_text("{}")
    with ModelFileServer({odd.name: odd}, TOKEN, ["127.0.0.1"]) as s:
        assert _request(s.urls[0], "GET", f"/files/{quote(odd.name)}", AUTH)[:1] == (200,)


def test_listens_only_on_the_given_addresses(model: dict[str, Path]) -> None:
    two = _can_bind("127.0.0.2")
    addresses = ["127.0.0.1", "127.0.0.2"] if two else ["127.0.0.1"]
    with ModelFileServer(model, TOKEN, addresses) as s:
        assert len(s.urls) == len(addresses)
        for address, url in zip(addresses, s.urls, strict=True):
            assert url.startswith(f"http://{address}:")
            assert s.url(address) == url
            assert _request(url, "GET", "/files/config.json", AUTH)[0] == 200
        # Not a wildcard bind: the same port on another local address refuses.
        port = _hostport(s.urls[0])[1]
        others = ["127.0.0.3"] if _can_bind("127.0.0.3") else []
        if socket.has_ipv6 and _can_bind6("::1"):
            others.append("::1")
        for other in others:
            family = socket.AF_INET6 if ":" in other else socket.AF_INET
            with socket.socket(family) as c, pytest.raises(OSError):
                c.settimeout(2)
                c.connect((other, port))
    assert _request_fails(s.urls[0])


def _can_bind6(address: str) -> bool:
    with socket.socket(socket.AF_INET6) as s:
        try:
            s.bind((address, 0))
        except OSError:
            return False
    return True


def _request_fails(url: str) -> bool:
    try:
        _request(url, "GET", "/files/config.json", AUTH)
    except OSError:
        return True
    return False


def test_ipv6_url_has_brackets(model: dict[str, Path]) -> None:
    if not _can_bind6("::1"):
        pytest.skip("no IPv6 loopback")
    with ModelFileServer(model, TOKEN, ["::1"]) as s:
        assert s.url("::1").startswith("http://[::1]:")
        assert _request(s.url("::1"), "GET", "/files/config.json", AUTH)[0] == 200


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "localhost", "not-an-ip", "192.0.2.123"])
def test_unusable_address_is_one_line_input_error(model: dict[str, Path], address: str) -> None:
    with pytest.raises(InputError) as err, ModelFileServer(model, TOKEN, [address]):
        pass
    message = str(err.value)
    assert address in message and "\n" not in message


def test_misuse_is_refused_early(model: dict[str, Path]) -> None:
    for token in ("", "tök"):
        with pytest.raises(ValueError, match="token"):
            ModelFileServer(model, token, ["127.0.0.1"])
    with pytest.raises(ValueError, match="address"):
        ModelFileServer(model, TOKEN, [])
    with ModelFileServer(model, TOKEN, ["127.0.0.1"]) as s, pytest.raises(ValueError):
        s.url("127.0.0.9")


def test_no_traceback_when_a_client_leaves_mid_file(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(32 << 20))  # more than socket buffers hold
    with ModelFileServer({"big.bin": big}, TOKEN, ["127.0.0.1"]) as s:
        host, port = _hostport(s.urls[0])
        for reset in (False, True):
            c = socket.create_connection((host, port), timeout=5)
            c.sendall(RAW_GET)
            c.recv(65536)
            if reset:  # RST instead of FIN
                c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(s.requests) < 2:
            time.sleep(0.02)
        assert [r[2] for r in s.requests] == [200, 200]
        # Counted per sendfile chunk: the chunk a client walked out of is not counted.
        assert s.served_bytes().get("big.bin", 0) < 2 * (32 << 20)
    assert capfd.readouterr().err == ""


def test_exit_is_quick_with_clients_connected(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(32 << 20))
    s = ModelFileServer({"big.bin": big}, TOKEN, ["127.0.0.1"])
    with s:
        host, port = _hostport(s.urls[0])
        idle = socket.create_connection((host, port), timeout=5)  # keep-alive, no request
        stalled = socket.create_connection((host, port), timeout=5)  # never reads the body
        stalled.sendall(RAW_GET)
        stalled.recv(1024)
        time.sleep(0.1)
        started = time.monotonic()
    assert time.monotonic() - started < 1.5
    assert [t for t in threading.enumerate() if t.name.startswith("model-file-server")] == []
    idle.close()
    stalled.close()


def test_concurrent_clients_share_the_server(tmp_path: Path) -> None:
    """Two ranks at once: both progress together (no client waits for the other's file), and
    neither gets less than a tenth of what was sent while both were reading. A server that
    serves one client at a time gives the second nothing until the first is done; the bound
    leaves room for a busy 2-core machine scheduling the two client threads unevenly (CI saw
    24.7 %)."""
    size = 24 << 20
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(size))
    got = [0, 0]
    done: list[float] = [0.0, 0.0]
    start = threading.Barrier(2)

    def pull(i: int, host: str, port: int) -> None:
        with socket.create_connection((host, port), timeout=10) as c:
            start.wait()
            c.sendall(RAW_GET)
            buf = bytearray(256 << 10)
            header = b""
            while b"\r\n\r\n" not in header:
                header += c.recv(1)
            # Read at a steady pace so the split reflects the server, not thread scheduling.
            while got[i] < size:
                n = c.recv_into(buf)
                if n == 0:
                    break
                got[i] += n
                time.sleep(0.001)
        done[i] = time.monotonic()

    with ModelFileServer({"big.bin": big}, TOKEN, ["127.0.0.1"]) as s:
        host, port = _hostport(s.urls[0])
        threads = [threading.Thread(target=pull, args=(i, host, port)) for i in (0, 1)]
        for t in threads:
            t.start()
        while all(d == 0.0 for d in done) and any(t.is_alive() for t in threads):
            time.sleep(0.005)
        at_first_finish = list(got)
        for t in threads:
            t.join(timeout=30)
    assert got == [size, size]
    assert min(at_first_finish) >= 0.1 * sum(at_first_finish), at_first_finish
