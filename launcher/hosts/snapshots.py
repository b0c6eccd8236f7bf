"""Snapshot directories: one subdirectory per host, holding its raw command outputs (+ host.yaml).

Reading turns each host into HostFacts (missing files are probe gaps, not errors); a directory
that is not a snapshot at all is an InputError naming it. Writing stores the bytes as probed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from topology.cluster_file import MAX_HOSTS, NAME_MAX, NAME_RE, HostSpec, parse_host
from topology.errors import InputError
from topology.facts import OPTIONAL_SNAPSHOT_FILES, SNAPSHOT_FILES, HostFacts
from topology.host_facts import ERROR_SUFFIX, UNAME_FILE, host_facts
from topology.untrusted import clean, load_yaml

HOST_YAML = "host.yaml"
KNOWN_FILES = (*SNAPSHOT_FILES, UNAME_FILE, *OPTIONAL_SNAPSHOT_FILES)
_MAX_FILE_BYTES = 16 * 1024 * 1024  # a real command output is well under 1 MB
_MAX_HOST_YAML_BYTES = 64 * 1024  # `ssh:` and `ips:`: a few lines


def _read_bytes(path: Path, limit: int, what: str) -> bytes:
    """At most `limit` bytes (read with a cap, so a file growing meanwhile changes nothing)."""
    with path.open("rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{path}: larger than {limit:,} bytes, not {what}")
    return data


def _read_text(path: Path) -> str:
    # surrogateescape: the bytes as probed, written back unchanged; the parsers check values
    return _read_bytes(path, _MAX_FILE_BYTES, "a command output").decode("utf-8", "surrogateescape")


def read_host_files(host_dir: Path) -> dict[str, str | None]:
    """{file: content or None} for every snapshot file, plus any `<file>.error` notes."""
    files: dict[str, str | None] = {}
    for name in KNOWN_FILES:
        for key in (name, name + ERROR_SUFFIX):
            path = host_dir / key
            if not path.is_file():
                files.setdefault(key, None)
                continue
            try:
                files[key] = _read_text(path)
            except OSError as e:
                files[key] = None
                files[name + ERROR_SUFFIX] = f"unreadable: {e.strerror}"
    return files


def _read_host_yaml(host_dir: Path) -> dict[str, Any]:
    path = host_dir / HOST_YAML
    if not path.is_file():
        return {}
    try:
        data = _read_bytes(path, _MAX_HOST_YAML_BYTES, "a host.yaml")
    except OSError as e:
        raise InputError(f"{path}: cannot read it ({e.strerror})") from None
    try:
        raw = load_yaml(data, str(path), max_bytes=_MAX_HOST_YAML_BYTES) or {}
    except InputError as e:
        raise InputError(f"{e}; write `ssh: host` and `ips: [...]`") from None
    if not isinstance(raw, dict):
        raise InputError(f"{path}: must be a mapping with `ssh:` and `ips:`")
    return raw


def _settings(d: Path, raw: dict[str, Any]) -> dict[str, Any]:
    """host.yaml checked by the cluster file's rules, as host_facts takes it (no ssh: None)."""
    if len(d.name) > NAME_MAX or not NAME_RE.fullmatch(d.name):
        raise InputError(
            f"{clean(str(d), 200)}: {clean(d.name)!r} is not a valid host name; rename the "
            "directory (letters, digits, '.', '_', '-')"
        )
    spec = parse_host(str(d / HOST_YAML), "", {**raw, "name": d.name})
    return {
        "ssh": spec.ssh if "ssh" in raw else None,
        "ips": list(spec.ips),
        "wired_limit_gb": spec.wired_limit_gb,
        "bandwidth_gbs": spec.bandwidth_gbs,
    }


def _host_dirs(directory: Path) -> list[Path]:
    where = f"--snapshot {directory}"
    if not directory.exists():
        raise InputError(
            f"{where}: no such directory (record one with `mlx-cluster topology snapshot`)"
        )
    if not directory.is_dir():
        raise InputError(f"{where}: not a directory (give the snapshot's top directory)")
    if any((directory / f).is_file() for f in KNOWN_FILES):
        raise InputError(
            f"{where}: this is one host's directory; give its parent (one subdirectory per host)"
        )
    dirs = sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(dirs) > MAX_HOSTS:
        raise InputError(f"{where}: {len(dirs)} host directories; at most {MAX_HOSTS} are read")
    if not any((d / f).is_file() for d in dirs for f in (*KNOWN_FILES, HOST_YAML)):
        raise InputError(
            f"{where}: not a snapshot (no host subdirectory holds {SNAPSHOT_FILES[0]} or "
            "any other snapshot file)"
        )
    return dirs


def load_snapshot_files(
    directory: str | Path,
) -> dict[str, tuple[dict[str, str | None], dict[str, Any]]]:
    """Per host name: (its files, its host.yaml mapping)."""
    dirs = _host_dirs(Path(directory))
    settings = [_settings(d, _read_host_yaml(d)) for d in dirs]  # all checked before any read
    return {d.name: (read_host_files(d), raw) for d, raw in zip(dirs, settings, strict=True)}


def load_snapshot(directory: str | Path) -> tuple[HostFacts, ...]:
    """HostFacts for every host of a snapshot directory, in name order."""
    return tuple(
        host_facts(name, files, yaml_)
        for name, (files, yaml_) in load_snapshot_files(directory).items()
    )


def check_out_dir(out: Path) -> None:
    """Refuse an --out that would overwrite something, before any host is probed."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"--out {out}: already exists and is not empty; give a new directory")
    if not out.parent.is_dir():
        raise InputError(f"--out {out}: its parent directory {out.parent} does not exist")


def host_yaml_for(host: HostSpec) -> dict[str, Any]:
    raw: dict[str, Any] = {"ssh": host.ssh}
    if host.ips:
        raw["ips"] = list(host.ips)
    return raw


def snapshot_file_name(file: str) -> bool:
    """A name a snapshot may hold: a known command output or its `.error` twin — never a path
    (agents on the network supply these names)."""
    base = file.removesuffix(ERROR_SUFFIX)
    return base in KNOWN_FILES


def write_snapshot(
    out: Path,
    files_by_host: Mapping[str, Mapping[str, str | None]],
    hosts: Sequence[HostSpec] = (),
) -> Path:
    """Write each host's files (bytes as probed) and a host.yaml for hosts we know how to reach."""
    check_out_dir(out)
    specs = {h.name: h for h in hosts}
    try:
        out.mkdir(exist_ok=True)
        for name, files in files_by_host.items():
            host_dir = out / name
            host_dir.mkdir()
            for file, content in files.items():
                if not snapshot_file_name(file):
                    raise InputError(f"{name}: refusing to write {file!r}: not a snapshot file")
                if content is not None:
                    (host_dir / file).write_bytes(content.encode("utf-8", "surrogateescape"))
            if name in specs:
                (host_dir / HOST_YAML).write_text(yaml.safe_dump(host_yaml_for(specs[name])))
    except OSError as e:
        raise InputError(f"--out {out}: cannot write the snapshot ({e.strerror})") from None
    return out
