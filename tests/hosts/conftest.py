"""Fixtures that build emulated hosts (tests/hosts/netns.py) and always tear them down."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hosts.netns import EmulatedHosts, NamespacesUnavailable, NetemUnavailable, require


@pytest.fixture
def make_hosts() -> Iterator[Callable[..., EmulatedHosts]]:
    """`make_hosts(n, topology=..., netem=..., sshd=...)` -> built hosts, torn down after the test.

    Skips (or, with CI=true, fails) with one reason when namespaces are impossible here.
    """
    with contextlib.ExitStack() as stack:

        def make(n: int, **kw: Any) -> EmulatedHosts:
            require(need_sshd=kw.get("sshd", True))
            try:
                return stack.enter_context(EmulatedHosts(n, **kw))
            except NetemUnavailable as e:  # a kernel feature, not a broken set-up: skip even on CI
                pytest.skip(str(e))
            except NamespacesUnavailable as e:
                require(need_sshd=True, reason=str(e))
                raise

        yield make


@pytest.fixture
def switch3(make_hosts: Callable[..., EmulatedHosts]) -> EmulatedHosts:
    return make_hosts(3, topology="switch")


@pytest.fixture
def mesh3(make_hosts: Callable[..., EmulatedHosts]) -> EmulatedHosts:
    return make_hosts(3, topology="mesh")
