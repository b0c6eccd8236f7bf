"""The agent's HTTP side, on a real socket: GET /snapshot and /facts, everything else refused."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import pytest

from launcher.discovery.http import SnapshotServer

SNAPSHOT = {"sw_vers.txt": "ProductName:\tmacOS\nProductVersion:\t26.2\n", "ibv_devices.txt": None}
FACTS = {"agent": {"name": "studio-a"}, "host": {"name": "studio-a", "is_mac": True}}


@pytest.fixture
def server() -> Iterator[SnapshotServer]:
    s = SnapshotServer(("127.0.0.1",), 0, SNAPSHOT, FACTS, "mlx-cluster-agent/test")
    s.start()
    try:
        yield s
    finally:
        s.close()


def _request(server: SnapshotServer, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request(method, path, body=b"x" if method in ("POST", "PUT") else None)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_get_snapshot_returns_the_files(server: SnapshotServer) -> None:
    status, headers, body = _request(server, "GET", "/snapshot")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body) == SNAPSHOT


def test_get_facts(server: SnapshotServer) -> None:
    status, _, body = _request(server, "GET", "/facts?x=1")
    assert status == 200 and json.loads(body) == FACTS


@pytest.mark.parametrize("path", ["/", "/snapshot/../etc/passwd", "/run?cmd=id", "/facts/x"])
def test_other_paths_are_404(server: SnapshotServer, path: str) -> None:
    assert _request(server, "GET", path)[0] == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
def test_other_methods_are_405(server: SnapshotServer, method: str) -> None:
    status, headers, _ = _request(server, method, "/snapshot")
    assert status == 405 and headers["Allow"] == "GET"


def test_unknown_method_is_refused(server: SnapshotServer) -> None:
    assert _request(server, "RUN", "/snapshot")[0] == 501


def test_second_bind_on_a_taken_port_fails_cleanly(server: SnapshotServer) -> None:
    with pytest.raises(OSError):
        SnapshotServer(("127.0.0.1",), server.port, SNAPSHOT, FACTS, "x")
