"""topology/untrusted.py and what rests on it: limits, aliases, whole-value matching, ranges,
the ssh_options allow-list and config.json's numbers (the hostile mass is test_fuzz_files.py)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
import yaml

from topology import untrusted
from topology.cluster_file import parse_cluster
from topology.errors import InputError, one_line
from topology.model.spec import spec_from_config
from topology.planning.plan import plan_context
from topology.ssh_options import check_ssh_options
from topology.untrusted import (
    Refused,
    decode_utf8,
    integer,
    json_depth,
    load_json,
    load_yaml,
    number,
    parse_json,
    parse_yaml,
    show,
    surrogate_offset,
)

LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 8,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
}


def test_json_depth_is_counted_not_recursed() -> None:
    json_depth("[" * 32 + "]" * 32)
    for deep in ("[" * 100_000, '{"a":' * 50_000, '["[[[[",' * 40):
        with pytest.raises(Refused, match="nested more than 32"):
            parse_json(deep)
    assert parse_json(json.dumps(["[" * 40])) == ["[" * 40]  # brackets inside a string
    json_depth('"\\"' * 200_000)  # unterminated, every quote escaped: linear, no error


def test_json_numbers_and_syntax_are_refused_not_raised() -> None:
    with pytest.raises(Refused, match="thousands of digits"):
        parse_json("1" * 5000)
    with pytest.raises(Refused, match="line 1 column 2"):
        parse_json("{x")
    assert math.isinf(parse_json("1e999"))  # accepted here: the getters refuse it


def test_yaml_aliases_are_refused_before_anything_expands() -> None:
    bomb = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    with pytest.raises(Refused, match="anchors and aliases"):
        parse_yaml(bomb)
    with pytest.raises(Refused, match="anchors"):
        parse_yaml("a: &x 1\n")
    with pytest.raises(Refused, match="nested more than 32"):
        parse_yaml("[" * 100_000)
    with pytest.raises(Refused, match="character '\\\\x00' at offset 3"):
        parse_yaml("x: \x00")
    assert parse_yaml("a: [1, {b: c}]") == {"a": [1, {"b": "c"}]}


LOADERS = [yaml.SafeLoader] + ([yaml.CSafeLoader] if hasattr(yaml, "CSafeLoader") else [])


@pytest.mark.parametrize("loader", LOADERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,  # libyaml (PyYAML 6.0.4) refuses this itself, past its own flow limit
        "hosts: " + "[" * 100_000,
        "{a: " * 2_000,
        "[" * 33 + "]" * 33,
        "".join(" " * i + "a:\n" for i in range(1_000)),
        "- " * 50_000 + "x",
    ],
    ids=["flow", "flow-after-key", "flow-maps", "just-over", "block", "dashes"],
)
def test_deep_yaml_is_our_one_line_whatever_the_parser(
    text: str, loader: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The contract is our line, not the wording of whichever YAML parser is installed.
    monkeypatch.setattr(untrusted, "_LOADER", loader)
    with pytest.raises(Refused, match=r"^nested more than 32 levels deep$"):
        parse_yaml(text)
    assert parse_yaml("a: '" + "[" * 40 + "' # " + "{" * 40 + "\nb: [[1]]") == {
        "a": "[" * 40,
        "b": [[1]],
    }
    with pytest.raises(Refused, match="not valid YAML"):  # a broken file stays a syntax error
        parse_yaml("a: [b, c\n")


def test_sizes_and_utf8_are_named_with_the_source() -> None:
    with pytest.raises(InputError, match=r"^f\.yaml: larger than 10 bytes"):
        load_yaml(b"x" * 11, "f.yaml", max_bytes=10)
    with pytest.raises(InputError, match=r"^f\.json: not UTF-8 text \(byte 0xff at offset 2\)"):
        load_json(b"[1\xff]", "f.json", max_bytes=100)
    with pytest.raises(InputError, match="not UTF-8"):
        decode_utf8(b"\xc0\xaf", "x")  # overlong "/"
    assert surrogate_offset(b"ab\xffc".decode("utf-8", "surrogateescape")) == 2
    assert surrogate_offset("clean") is None


@pytest.mark.parametrize("value", [True, 1.5, "3", None, -1, 10**5000, 2**64, [], {}], ids=show)
def test_integer_refuses_everything_outside_its_range(value: Any) -> None:
    with pytest.raises(InputError) as e:
        integer(value, "c.json", "layers", 1, 1024)
    msg = str(e.value)
    assert msg.startswith("c.json: layers: must be a whole number from 1 to 1,024")
    assert len(msg) < 120 and "\n" not in msg


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e308, 10**400, False, "1"])
def test_number_refuses_non_finite_and_absurd(value: Any) -> None:
    with pytest.raises(InputError, match=r"x: k: must be a number from 1"):
        number(value, "x", "k", 1, 100)
    assert number(50, "x", "k", 1, 100) == 50.0


def test_show_and_one_line_never_grow_with_the_value() -> None:
    assert show(10**5000) == "an integer of 16610 bits"
    assert len(show("a" * 10**6)) < 70 and show("a\nb") == "'a\\nb'"
    assert one_line("a\nb\x1b[31m\udcff") == "a\\nb\\x1b[31m\\udcff"
    assert len(str(InputError("x" * 10**6))) == 1000


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('hosts: [{name: a, ssh: "a\\n"}]', "not a valid ssh destination"),
        ('hosts: [{name: "a\\n", ssh: a}]', "not a valid host name"),
        ('hosts: ["a\\n"]', "not a valid ssh destination"),
        ('hosts: [{name: a, ssh: a, python: "/p\\n"}]', "not a valid path"),
        ('hosts: [a]\nenv: ["A=1\\n"]', "not a valid NAME=value"),
        ("hosts: [a]\nenv: [LD_PRELOAD=/tmp/x.so]", "env[0]: LD_PRELOAD makes every rank load"),
        ("hosts: [a]\nenv: [A=1, PYTHONSTARTUP=/x.py]", "env[1]: PYTHONSTARTUP"),
        ('hosts: [{name: a, ssh: a, ips: ["fe80::1%$(x)"]}]', "not an IP address"),
        ("hosts: [{name: a, ssh: '-oProxyCommand=x@h'}]", "not a valid ssh destination"),
        ("hosts: [{name: a, ssh: a, wired_limit_gb: 1e400}]", "wired_limit_gb: must be a number"),
        ("hosts: [{name: a, ssh: a, wired_limit_gb: .nan}]", "from 1.0 to 16,384.0"),
        ("hosts: [{name: a, ssh: a, bandwidth_gbs: 1.0e+12}]", "bandwidth_gbs: must be a number"),
        ("hosts: [{name: a, ssh: a, wired_limit_gb: true}]", "got True"),
        ("hosts: [{name: " + "a" * 65 + ", ssh: a}]", "longer than 64"),
        ("hosts: [" + ", ".join(f"h{i}" for i in range(65)) + "]", "at most 64"),
        ("hosts: [{name: a, ssh: a, wired_limit_gb: " + "9" * 5000 + "}]", "not valid YAML"),
        ("hosts: &h [a]\n", "anchors and aliases"),
    ],
)
def test_cluster_file_values_are_checked_whole_and_in_range(text: str, words: str) -> None:
    with pytest.raises(InputError) as e:
        parse_cluster(text, "c.yaml")
    assert str(e.value).startswith("c.yaml: ") and words in str(e.value), str(e.value)
    assert "\n" not in str(e.value) and len(str(e.value)) < 300


ALLOWED = [
    ["-p", "2222"], ["-p2222"], ["-l", "admin"], ["-i", "~/.ssh/id_ed25519"],
    ["-J", "jump.local"], ["-J", "me@a:2222,b"], ["-o", "ConnectTimeout=5"],
    ["-oPort=22"], ["-o", "StrictHostKeyChecking=accept-new"], ["-o", "ProxyJump=none"],
    ["-o", "ControlPath=~/.ssh/cm-%r@%h:%p"], ["-o", "ControlPersist=10m"], ["-4", "-C", "-q"],
    ["-o", "UserKnownHostsFile=/dev/null"], ["-o", "BatchMode=yes"], ["-vvv"],
]  # fmt: skip


@pytest.mark.parametrize("options", ALLOWED, ids=" ".join)
def test_connection_settings_are_allowed(options: list[str]) -> None:
    assert check_ssh_options(options, "c.yaml") == tuple(options)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["-o", "ProxyCommand=nc %h %p"], "ProxyCommand makes ssh run a program"),
        (["-oProxyCommand=x"], "run a program on this machine"),
        (["-o", "proxycommand=x"], "run a program"),
        (["-o", "LocalCommand=x"], "run a program"),
        (["-o", "PermitLocalCommand=yes"], "run a program"),
        (["-o", "KnownHostsCommand=x"], "run a program"),
        (["-o", "Match=exec x"], "run a program"),
        (["-o", "PKCS11Provider=/x.so"], "run a program"),
        (["-F", "/tmp/cfg"], "-F reads another config file"),
        (["-F/tmp/cfg"], "-F reads another config file"),
        (["-o", "SendEnv=X"], "is not an allowed ssh option"),
        (["-L", "1:a:2"], "is not an allowed ssh option"),
        (["-p", "-oProxyCommand=x"], "must be a port"),
        (["-p", "99999"], "must be a port"),
        (["-o", "ConnectTimeout=abc"], "ConnectTimeout must be seconds"),
        (["-o", "BatchMode=no"], "BatchMode must be yes"),
        (["-o", "ConnectTimeout"], "written ConnectTimeout=VALUE"),
        (["-J", "-oProxyCommand=x"], "must be [user@]host"),
        (["-o"], "needs a value"),
        (["ConnectTimeout=5"], "not an allowed ssh option"),
    ],
)
def test_everything_else_is_refused_naming_the_option(options: list[str], words: str) -> None:
    with pytest.raises(InputError) as e:
        check_ssh_options(options, "c.yaml")
    msg = str(e.value)
    assert msg.startswith("c.yaml: ssh_options[") and words in msg, msg
    assert "~/.ssh/config" in msg or "must be" in msg or "needs a value" in msg
    assert "\n" not in msg and len(msg) < 300


def test_ssh_options_are_checked_when_the_cluster_file_is_read() -> None:
    with pytest.raises(InputError, match=r"c\.yaml: ssh_options\[1\]: ProxyCommand"):
        parse_cluster("hosts: [a]\nssh_options: ['-o', 'ProxyCommand=nc']\n", "c.yaml")


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("num_hidden_layers", 10**9, "from 1 to 1,024"),
        ("num_hidden_layers", 1e3, "got 1000.0"),
        ("hidden_size", 10**5000, "an integer of"),
        ("vocab_size", -5, "from 1 to 8,388,608"),
        ("num_experts", 10**6, "num_experts: must be a whole number from 0 to 4,096"),
        ("max_position_embeddings", 2**40, "max_position_embeddings"),
        ("quantization", {"bits": 64, "group_size": 64}, "quantization: bits"),
        ("quantization", {"bits": 4, "group_size": 0}, "group_size"),
        ("tie_word_embeddings", "no", "tie_word_embeddings"),
        ("model_type", "llama\n", "model_type"),
    ],
    ids=lambda v: show(v, 20),  # pytest's own ids would str() a 5000-digit int
)
def test_config_numbers_out_of_range_name_file_key_and_range(
    key: str, value: Any, words: str
) -> None:
    with pytest.raises(InputError) as e:
        spec_from_config({**LLAMA, key: value}, source="m/config.json")
    msg = str(e.value)
    assert msg.startswith("m/config.json: ") and words in msg, msg
    assert "\n" not in msg and len(msg) < 300


def test_moe_counts_are_checked_together() -> None:
    moe = {**LLAMA, "num_experts": 8, "num_experts_per_tok": 9, "moe_intermediate_size": 64}
    with pytest.raises(InputError, match="num_experts_per_tok: 9 is more than the 8 experts"):
        spec_from_config(moe)
    with pytest.raises(InputError, match=r"mlp_only_layers\[0\]: must be a layer number"):
        spec_from_config({**moe, "num_experts_per_tok": 2, "mlp_only_layers": [10**9]})
    with pytest.raises(InputError, match="decoder_sparse_step"):
        spec_from_config({**moe, "num_experts_per_tok": 2, "decoder_sparse_step": "2"})
    with pytest.raises(InputError, match=r"metadata\.total_size: must be a number of bytes"):
        spec_from_config(LLAMA, {"metadata": {"total_size": 1e300}}, "m/config.json")


def test_context_is_capped_by_the_model_not_beyond_it() -> None:
    spec = spec_from_config(LLAMA, source="m/config.json")
    assert spec.max_context == 2048
    assert plan_context(spec, None) == 2048  # the default, capped at what the model supports
    assert plan_context(spec, 4096) == 2048  # the CLI's default arrives as a plain 4096
    assert plan_context(spec, 1000) == 1000
    with pytest.raises(InputError) as e:
        plan_context(spec, 10_000)
    assert re.fullmatch(
        r"--context 10,000: more than the model's max_position_embeddings \(2,048, "
        r"m/config\.json\); give --context 2048 or less",
        str(e.value),
    )
    unbounded = spec_from_config({k: v for k, v in LLAMA.items() if "position" not in k})
    assert plan_context(unbounded, 100_000) == 100_000
    with pytest.raises(InputError, match="16,777,216 tokens"):
        plan_context(unbounded, 10**12)


def test_round_trip_through_json_keeps_the_config_valid() -> None:
    assert spec_from_config(json.loads(json.dumps(LLAMA))).layers == 4
