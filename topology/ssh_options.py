"""What a cluster file's `ssh_options` may say: how to connect, never a program to run.

ssh can run local programs on a config's say-so (ProxyCommand, LocalCommand, KnownHostsCommand,
Match exec, a -F file holding any of them). A cluster file is data, so its ssh_options are an
allow-list of connection settings; anything else belongs in ~/.ssh/config, which ssh reads anyway.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from topology.errors import InputError
from topology.untrusted import show

_HOST = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
_JUMP_RE = re.compile(rf"(?:{_USER_RE.pattern}@)?{_HOST}(?::[0-9]{{1,5}})?")
# Paths may hold ssh's %-tokens (%h, %p, %r: expanded by ssh, never run); no leading "-".
_PATH_RE = re.compile(r"[A-Za-z0-9_./~+@=%:,][A-Za-z0-9_./~+@=%:,-]{0,1023}")
_WORDS_RE = re.compile(r"[A-Za-z0-9_.,@+^-]{1,512}")  # algorithm and method lists
_YES_NO = ("yes", "no")

Check = Callable[[str], bool]


def _choice(*words: str) -> Check:
    return lambda v: v.lower() in words


def _int(lo: int, hi: int) -> Check:
    return lambda v: v.isascii() and v.isdigit() and len(v) <= 6 and lo <= int(v) <= hi


def _jumps(v: str) -> bool:
    return v.lower() == "none" or all(_JUMP_RE.fullmatch(j) for j in v.split(","))


def _persist(v: str) -> bool:  # yes, no, or a time: 600, 10m, 1h
    return _choice(*_YES_NO)(v) or bool(re.fullmatch(r"[0-9]{1,6}[smhdwSMHDW]?", v))


_PORT = _int(1, 65535)
_SECONDS = _int(0, 86400)
_COUNT = _int(0, 1000)
_YESNO = _choice(*_YES_NO)

# `-o Key=Value` keys (lower case, as ssh compares them) -> what the value must be.
OPTIONS: dict[str, tuple[str, Check]] = {
    "connecttimeout": ("seconds (0-86400)", _SECONDS),
    "connectionattempts": ("a count (0-1000)", _COUNT),
    "port": ("a port (1-65535)", _PORT),
    "user": ("a user name", lambda v: bool(_USER_RE.fullmatch(v))),
    "identityfile": ("a path", lambda v: bool(_PATH_RE.fullmatch(v))),
    "certificatefile": ("a path", lambda v: bool(_PATH_RE.fullmatch(v))),
    "identitiesonly": ("yes or no", _YESNO),
    "stricthostkeychecking": ("yes, no, accept-new, off or ask",
                              _choice("yes", "no", "accept-new", "off", "ask")),
    "userknownhostsfile": ("a path", lambda v: bool(_PATH_RE.fullmatch(v))),
    "globalknownhostsfile": ("a path", lambda v: bool(_PATH_RE.fullmatch(v))),
    "hostkeyalias": ("a host name", lambda v: bool(re.fullmatch(_HOST, v))),
    "checkhostip": ("yes or no", _YESNO),
    "serveraliveinterval": ("seconds (0-86400)", _SECONDS),
    "serveralivecountmax": ("a count (0-1000)", _COUNT),
    "tcpkeepalive": ("yes or no", _YESNO),
    "proxyjump": ("[user@]host[:port],... or none", _jumps),
    "batchmode": ("yes (mlx-cluster never prompts)", _choice("yes")),
    "compression": ("yes or no", _YESNO),
    "loglevel": ("QUIET, FATAL, ERROR, INFO, VERBOSE or DEBUG1-3", _choice(
        "quiet", "fatal", "error", "info", "verbose", "debug", "debug1", "debug2", "debug3")),
    "addressfamily": ("any, inet or inet6", _choice("any", "inet", "inet6")),
    "controlmaster": ("yes, no, ask, auto or autoask",
                      _choice("yes", "no", "ask", "auto", "autoask")),
    "controlpath": ("a path", lambda v: bool(_PATH_RE.fullmatch(v))),
    "controlpersist": ("yes, no or a time (600, 10m)", _persist),
    "preferredauthentications": ("a list of methods", lambda v: bool(_WORDS_RE.fullmatch(v))),
    "pubkeyauthentication": ("yes or no", _YESNO),
    "hostkeyalgorithms": ("a list of algorithms", lambda v: bool(_WORDS_RE.fullmatch(v))),
    "pubkeyacceptedalgorithms": ("a list of algorithms", lambda v: bool(_WORDS_RE.fullmatch(v))),
    "pubkeyacceptedkeytypes": ("a list of algorithms", lambda v: bool(_WORDS_RE.fullmatch(v))),
    "kexalgorithms": ("a list of algorithms", lambda v: bool(_WORDS_RE.fullmatch(v))),
    "ciphers": ("a list of ciphers", lambda v: bool(_WORDS_RE.fullmatch(v))),
    "macs": ("a list of MACs", lambda v: bool(_WORDS_RE.fullmatch(v))),
    "ipqos": ("QoS words", lambda v: bool(_WORDS_RE.fullmatch(v))),
    "hashknownhosts": ("yes or no", _YESNO),
    "updatehostkeys": ("yes, no or ask", _choice("yes", "no", "ask")),
    "verifyhostkeydns": ("yes, no or ask", _choice("yes", "no", "ask")),
}  # fmt: skip

# Short options taking a value -> the -o key whose rule applies to it.
SHORT_WITH_VALUE = {"-p": "port", "-l": "user", "-i": "identityfile", "-J": "proxyjump"}
FLAGS = frozenset({"-4", "-6", "-C", "-q", "-v", "-vv", "-vvv"})

# Named in the refusal: these make ssh run a program here, or read settings that may.
RUNS_PROGRAMS = frozenset(
    {"proxycommand", "localcommand", "permitlocalcommand", "knownhostscommand", "match",
     "include", "pkcs11provider", "securitykeyprovider", "remotecommand"}
)  # fmt: skip
_SHORT_RUNS = {"-F": "reads another config file", "-I": "loads a PKCS#11 library"}
_HOME = "put it in ~/.ssh/config for that host instead"


def _refuse(source: str, i: int, what: str) -> InputError:
    return InputError(f"{source}: ssh_options[{i}]: {what}")


def _option(source: str, i: int, arg: str) -> None:
    key, sep, value = arg.partition("=")
    rule = OPTIONS.get(key.lower())
    if key.lower() in RUNS_PROGRAMS:
        raise _refuse(
            source, i, f"{key} makes ssh run a program on this machine, which a cluster file "
            f"may not ask for; {_HOME} (ssh_options may only set connection settings)",
        )  # fmt: skip
    if rule is None:
        raise _refuse(
            source, i, f"-o {show(key)} is not an allowed ssh option (see README, *The cluster "
            f"file*, for the list); {_HOME}",
        )  # fmt: skip
    kind, ok = rule
    if not sep or not ok(value):
        raise _refuse(source, i, f"{show(arg)}: {key} must be {kind}, written {key}=VALUE")


def check_ssh_options(options: Sequence[str], source: str) -> tuple[str, ...]:
    """The options as given, or InputError naming the first one ssh_options may not carry."""
    i = 0
    while i < len(options):
        arg = options[i]
        flag, attached = arg[:2], arg[2:]
        if arg in FLAGS:
            i += 1
            continue
        if flag == "-o" or flag in SHORT_WITH_VALUE:
            if not attached:  # "-p 22": the value is the next item
                if i + 1 >= len(options):
                    raise _refuse(source, i, f"{arg} needs a value after it")
                i += 1
                attached = options[i]
            if flag == "-o":
                _option(source, i, attached)
            else:
                key = SHORT_WITH_VALUE[flag]
                kind, ok = OPTIONS[key]
                if not ok(attached):
                    raise _refuse(source, i, f"{flag} {show(attached)}: must be {kind}")
            i += 1
            continue
        if flag in _SHORT_RUNS:
            raise _refuse(source, i, f"{flag} {_SHORT_RUNS[flag]}, which may run programs; {_HOME}")
        raise _refuse(
            source, i, f"{show(arg)} is not an allowed ssh option (allowed: -p, -l, -i, -J, -4, "
            f"-6, -C, -q, -v and -o KEY=VALUE, see README); {_HOME}",
        )  # fmt: skip
    return tuple(options)
