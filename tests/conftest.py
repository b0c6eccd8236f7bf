"""Test settings shared by every package (paths live in tests/paths.py, a plain module, because
every folder's conftest.py is a module named `conftest`): the BLAS this process multiplies with,
and how pytest-xdist shares the tests out (scripts/check runs `-n 2 --dist loadgroup`).

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
# Measured on the 2-core CI machine, serial; a stale list costs time, never correctness.
SLOWEST_FIRST = [
    "tests/launcher/test_slow_work.py",  # 186 s, one test
    "tests/launcher/test_serve_hosts.py",  # 243 s
    "tests/hosts/test_model_share.py",  # 239 s
    "tests/hosts/test_multihost.py",  # 210 s
    "tests/cluster/test_uneven_tensor.py",  # ~150 s (17 multi-rank runs)
    "tests/launcher/test_launch.py",  # ~110 s with the real model's demo
    "tests/launcher/test_serve_tool_cuts.py",  # 91 s
    "tests/hosts/test_setup_apply.py",  # 87 s
    "tests/cluster/test_rank_decode.py",  # 71 s
    "tests/hosts/test_discovery.py",  # 63 s
    "tests/launcher/test_bench.py",  # 60 s
    "tests/launcher/test_serve_memory.py",  # 47 s
    "tests/launcher/test_draft_model.py",  # 45 s
    "tests/launcher/test_dashboard_hosts.py",  # 43 s
    "tests/launcher/test_serve.py",  # 41 s
    "tests/launcher/test_cmd_topology.py",  # 40 s
    "tests/launcher/test_serve_batching.py",  # 39 s
    "tests/launcher/test_serve_api.py",  # 38 s
    "tests/cluster/test_serve_engine.py",  # 34 s
    "tests/launcher/test_supervisor.py",  # 32 s
    "tests/launcher/test_dashboard.py",  # 31 s
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
