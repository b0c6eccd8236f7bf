"""A Mac's commands, faked for an emulated host: `python fake_mac.py STATE NAME ARGS...`.

STATE holds the host's snapshot files (what the probe will read back) and `calls.jsonl`, one JSON
list per call (`[name, *args]`). The two commands `topology setup` runs change the files the way
macOS would (`networksetup -setmanual`, `ifconfig bridge0 deletem`); `sudo -n` runs its command
unless STATE/sudo_asks exists (then it fails as sudo does when it would need a password).
Wrappers named like the commands, first on the host's PATH, exec this file.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: snapshot_edit

from snapshot_edit import run_command

# What each probe command prints: the snapshot file holding its output.
OUTPUTS = {
    (
        "system_profiler",
        "SPThunderboltDataType",
        "-json",
    ): "system_profiler_SPThunderboltDataType.json",
    ("networksetup", "-listallhardwareports"): "networksetup_listallhardwareports.txt",
    ("ibv_devices",): "ibv_devices.txt",
    ("ibv_devinfo",): "ibv_devinfo.txt",
    ("rdma_ctl", "status"): "rdma_ctl_status.txt",
    ("sw_vers",): "sw_vers.txt",
    ("sysctl", "hw.memsize", "hw.model", "machdep.cpu.brand_string"): "sysctl.txt",
    ("ifconfig",): "ifconfig.txt",
}
NAMES = sorted({"uname", "sudo", *(cmd[0] for cmd in OUTPUTS)})


def _sudo(state: Path, args: list[str]) -> int:
    if args[:1] != ["-n"] or len(args) < 2:
        print("sudo: a terminal is required to read the password", file=sys.stderr)
        return 1
    if (state / "sudo_asks").exists():
        print("sudo: a password is required", file=sys.stderr)
        return 1
    os.execvp(args[1], args[1:])  # the fake commands come first on PATH
    return 127


def _change(state: Path, argv: list[str]) -> int:
    files: dict[str, str | None] = {
        f: (state / f).read_text()
        for f in ("ifconfig.txt", "networksetup_listallhardwareports.txt")
    }
    try:
        run_command(files, argv)
    except ValueError as e:
        print(f"{argv[0]}: {e}", file=sys.stderr)
        return 1
    (state / "ifconfig.txt").write_text(files["ifconfig.txt"] or "")
    return 0


def main(state: Path, name: str, args: list[str]) -> int:
    with (state / "calls.jsonl").open("a") as log:
        log.write(json.dumps([name, *args]) + "\n")
    if name == "sudo":
        return _sudo(state, args)
    if name == "uname":
        print("Darwin")
        return 0
    output = OUTPUTS.get((name, *args))
    if output is not None:
        path = state / output
        sys.stdout.write(path.read_text() if path.is_file() else "")
        return 0
    return _change(state, [name, *args])


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:]))
