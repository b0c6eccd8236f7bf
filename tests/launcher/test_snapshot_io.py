"""Snapshot directories on disk: read back what was written, refuse what is not a snapshot."""

from __future__ import annotations

from pathlib import Path

import pytest
import synth

from launcher.hosts.snapshots import check_out_dir, load_snapshot, read_host_files, write_snapshot
from topology.cluster_file import HostSpec
from topology.errors import InputError


def test_synthesized_snapshot_reads_back_to_the_same_facts(tmp_path: Path) -> None:
    c = synth.mesh(3)
    c.host("studio-b").ips = ("10.0.0.2",)
    c.host("studio-b").ssh = "admin@studio-b.local"
    c.write(tmp_path / "snap")
    assert load_snapshot(tmp_path / "snap") == c.facts()


def test_write_then_read_keeps_bytes_exactly(tmp_path: Path) -> None:
    raw = b"hw.memsize: 1\n\xff\xfe odd bytes \xcb\x87\n"
    text = raw.decode("utf-8", "surrogateescape")
    files = {"h1": {"sysctl.txt": text, "ibv_devinfo.txt": None, "uname.txt.error": "x\n"}}
    write_snapshot(tmp_path / "out", files, [HostSpec("h1", "h1.local", ("10.1.1.1",))])
    assert (tmp_path / "out" / "h1" / "sysctl.txt").read_bytes() == raw
    assert not (tmp_path / "out" / "h1" / "ibv_devinfo.txt").exists()
    back = read_host_files(tmp_path / "out" / "h1")
    assert back["sysctl.txt"] == text and back["ibv_devinfo.txt"] is None
    [h] = load_snapshot(tmp_path / "out")
    assert h.ssh == "h1.local" and h.ips == ("10.1.1.1",) and h.memory_bytes == 1


def test_missing_files_are_gaps_not_errors(tmp_path: Path) -> None:
    c = synth.mesh(2)
    c.write(tmp_path)
    (tmp_path / "studio-a" / "sw_vers.txt").unlink()
    a, _ = load_snapshot(tmp_path)
    assert [g.file for g in a.gaps] == ["sw_vers.txt"]


def bad(directory: Path, match: str) -> None:
    with pytest.raises(InputError, match=match) as e:
        load_snapshot(directory)
    assert "\n" not in str(e.value)
    assert str(directory) in str(e.value) or "host.yaml" in str(e.value)


def test_unusable_directories_are_input_errors(tmp_path: Path) -> None:
    bad(tmp_path / "nope", "no such directory")
    (tmp_path / "file").write_text("x")
    bad(tmp_path / "file", "not a directory")
    (tmp_path / "empty").mkdir()
    bad(tmp_path / "empty", "not a snapshot")
    (tmp_path / "other" / "sub").mkdir(parents=True)
    (tmp_path / "other" / "sub" / "notes.txt").write_text("hi")
    bad(tmp_path / "other", "not a snapshot")
    synth.mesh(2).write(tmp_path / "snap")
    bad(tmp_path / "snap" / "studio-a", "one host's directory; give its parent")


@pytest.mark.parametrize(
    ("host_yaml", "match"),
    [
        ("ssh: [unclosed", "not valid YAML"),
        ("- a\n- b\n", "must be a mapping"),
        ("ssh: a\nport: 22\n", "unknown key"),
        ("ssh: 'a;touch /tmp/x'\n", "not a valid ssh destination"),
        ("ips: [not-an-ip]\n", "not an IP address"),
    ],
)
def test_bad_host_yaml(tmp_path: Path, host_yaml: str, match: str) -> None:
    synth.mesh(2).write(tmp_path)
    (tmp_path / "studio-b" / "host.yaml").write_text(host_yaml)
    with pytest.raises(InputError, match=match) as e:
        load_snapshot(tmp_path)
    assert "studio-b/host.yaml" in str(e.value) and "hosts[0]" not in str(e.value)


def test_host_directory_name_must_be_a_host_name(tmp_path: Path) -> None:
    synth.Cluster([synth.SynthHost("a b;c")]).write(tmp_path)
    with pytest.raises(InputError, match="not a valid host name"):
        load_snapshot(tmp_path)


def test_out_dir_must_be_new_or_empty(tmp_path: Path) -> None:
    check_out_dir(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    check_out_dir(tmp_path / "empty")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    with pytest.raises(InputError, match="not empty"):
        check_out_dir(tmp_path / "used")
    with pytest.raises(InputError, match="parent directory"):
        check_out_dir(tmp_path / "no" / "such")


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/absolute", "notes.txt", "sub/sw_vers.txt"])
def test_only_snapshot_file_names_are_ever_written(tmp_path: Path, name: str) -> None:
    # names come from agents on the network: a path must never leave the snapshot folder
    with pytest.raises(InputError, match="not a snapshot file"):
        write_snapshot(tmp_path / "snap", {"h": {"sw_vers.txt": "x", name: "evil"}})
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "snap" / "notes.txt").exists()
    write_snapshot(tmp_path / "ok", {"h": {"sw_vers.txt": "x", "sw_vers.txt.error": "y"}})
    assert sorted(p.name for p in (tmp_path / "ok" / "h").iterdir()) == [
        "sw_vers.txt",
        "sw_vers.txt.error",
    ]


def test_versions_txt_is_optional_and_round_trips(tmp_path: Path) -> None:
    c = synth.mesh(2)
    c.host("studio-a").versions = {"python": "3.12.7", "mlx": "0.32.2", "mlx-lm": None}
    c.write(tmp_path / "snap")
    a, b = load_snapshot(tmp_path / "snap")
    assert a.software is not None and a.software.version("mlx") == "0.32.2"
    assert a.software.has("mlx-lm") and a.software.version("mlx-lm") is None
    assert b.software is None and b.gaps == ()  # no file: complete all the same
    files = {"h": {"versions.txt": "python 3.11.2\nmlx -\n", "versions.txt.error": None}}
    write_snapshot(tmp_path / "out", files)
    assert (tmp_path / "out" / "h" / "versions.txt").read_text() == "python 3.11.2\nmlx -\n"
    assert read_host_files(tmp_path / "out" / "h")["versions.txt"] == "python 3.11.2\nmlx -\n"
