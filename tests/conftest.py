"""Test settings shared by every package (paths live in tests/paths.py, a plain module, because
every folder's conftest.py is a module named `conftest`): the BLAS this process multiplies with,
and how pytest-xdist shares the tests out (scripts/check runs `-n 3 --dist loadgroup`).

Ranks on Linux multiply with the host's OpenBLAS (cluster/blas.py): the single-process references
computed in this process use it too, one thread everywhere, since OpenBLAS's sums depend on its
thread count and logits are compared within 1e-4."""

import os

import pytest

from cluster import blas

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
blas.use_in_this_process()

# The suite mostly waits on subprocesses (ranks, servers, sshd in network namespaces), so xdist
# workers overlap those waits even on 2 cores. Each test module is one unit of work (its
# module-scoped servers and models are built once, on one worker), unless a test names an
# xdist_group of its own. Units start slowest first, so the longest one (a single test that
# sleeps through a 60 s prefill chunk) is not left for the end; the rest keep their order.
# Measured on the 2-core CI machine (worker seconds); a stale list costs time, never correctness.
SLOWEST_FIRST = [
    "tests/launcher/test_slow_work.py",  # 184 s, one test
    "tests/hosts/test_multihost.py",  # 275 s
    "tests/hosts/test_model_share.py",  # 186 s
    "tests/launcher/test_serve_hosts.py",  # 184 s
    "tests/launcher/test_serve_tool_cuts.py",  # 102 s
    "tests/cluster/test_uneven_tensor.py",  # ~110 s (21+ multi-rank runs)
    "tests/launcher/test_serve.py",  # ~90 s with 4 ranks losing one
    "tests/hosts/test_setup_apply.py",  # 63 s
    "tests/launcher/test_bench.py",  # 62 s
    "tests/hosts/test_discovery.py",  # 54 s
    "tests/launcher/test_launch.py",  # 54 s with the real model's demo
    "tests/launcher/test_cmd_topology.py",  # 41 s
    "tests/cluster/test_rank_decode.py",  # 40 s
    "tests/launcher/test_supervisor.py",  # 35 s
    "tests/launcher/test_dashboard_hosts.py",  # 34 s
    "tests/launcher/test_serve_batching.py",  # 34 s
    "tests/launcher/test_draft_model.py",  # 33 s
    "tests/launcher/test_serve_memory.py",  # 28 s
    "tests/launcher/test_dashboard.py",  # 27 s
    "tests/launcher/test_serve_api.py",  # 27 s
]


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(_module(item)))
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(_module(item), len(rank)))  # stable: order kept within
