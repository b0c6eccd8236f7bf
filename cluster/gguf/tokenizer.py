"""A Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) rebuilt from a GGUF's
vocabulary, merges and token types, with the `tokenizers` library.

Only byte-level BPE (`tokenizer.ggml.model = gpt2`) is rebuilt, and only for pre-tokenizers
whose llama.cpp splitting rules we reproduce exactly (`tokenizer.ggml.pre`): a different split
would give the model token sequences it never saw, so any other is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topology.errors import InputError

CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types: control tokens are special


def _gpt2() -> list[Any]:
    from tokenizers import pre_tokenizers

    return [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]


def _digits_then_gpt2() -> list[Any]:
    """llama.cpp's smollm/starcoder/refact rules: every digit alone (\\p{N}), then GPT-2's."""
    from tokenizers import pre_tokenizers

    return [pre_tokenizers.Digits(individual_digits=True), *_gpt2()]


PRE_TOKENIZERS: dict[str, Callable[[], list[Any]]] = {
    "gpt2": _gpt2,
    "smollm": _digits_then_gpt2,
    "starcoder": _digits_then_gpt2,
    "refact": _digits_then_gpt2,
}


@dataclass(frozen=True)
class TokenizerFiles:
    tokenizer_json: str
    config: dict[str, object]  # tokenizer_config.json
    bos_id: int | None
    eos_ids: tuple[int, ...]  # end of sequence, then end of turn when the file names another


def build_tokenizer(
    meta: Mapping[str, Any], path: Path, vocab: int, context: int
) -> TokenizerFiles:
    """The tokenizer files for the GGUF's vocabulary (`vocab` = the embedding's rows)."""
    kind, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre", "gpt2")
    if kind != "gpt2":
        raise InputError(
            f"{path}: tokenizer {kind!r} is not supported: import-gguf rebuilds byte-level BPE "
            "tokenizers (tokenizer.ggml.model = gpt2) only"
        )
    if pre not in PRE_TOKENIZERS:
        raise InputError(
            f"{path}: pre-tokenizer {pre!r} is not supported (supported: "
            f"{', '.join(PRE_TOKENIZERS)}); convert the original checkpoint with mlx_lm.convert"
        )
    tokens, pairs = _vocabulary(meta, path, vocab)
    types = _types(meta, path, vocab)
    ids = {which: _token_id(meta, path, which, vocab) for which in _IDS}
    add_bos, add_eos = _flag(meta, "add_bos_token"), _flag(meta, "add_eos_token")
    bos, eos = ids["bos"], ids["eos"]
    if (add_bos and bos is None) or (add_eos and eos is None):
        raise InputError(f"{path}: the tokenizer adds a BOS/EOS token it does not name")
    ends = (
        [bos] if add_bos and bos is not None else [],
        [eos] if add_eos and eos is not None else [],
    )
    tokenizer_json = _tokenizer_json(tokens, pairs, types, PRE_TOKENIZERS[pre](), ends)

    def name(i: int | None) -> str | None:
        return None if i is None else tokens[i]

    config: dict[str, object] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name(bos),
        "eos_token": name(eos),
        "pad_token": name(ids["padding"]),
        "unk_token": name(ids["unknown"]),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context,
    }
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str):
        config["chat_template"] = template
    eos_ids = tuple(dict.fromkeys(i for i in (eos, ids["eot"]) if i is not None))
    return TokenizerFiles(tokenizer_json, config, bos, eos_ids)


_IDS = ("bos", "eos", "eot", "padding", "unknown")  # tokenizer.ggml.X_token_id


def _tokenizer_json(
    tokens: list[str],
    pairs: list[tuple[str, str]],
    types: list[int],
    pre: list[Any],
    ends: tuple[list[int], list[int]],
) -> str:
    """tokenizer.json: byte-level BPE; control tokens special, user-defined ones added."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {token: i for i, token in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(pre)
    tok.decoder = decoders.ByteLevel()
    special = [t for t, kind in zip(tokens, types, strict=True) if kind == CONTROL]
    added = [t for t, kind in zip(tokens, types, strict=True) if kind == USER_DEFINED]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tok.add_tokens([AddedToken(t, normalized=False) for t in added])
    first, last = ends
    if first or last:  # GGUF's add_bos_token: the encoder puts BOS first, as llama.cpp does
        tok.post_processor = processors.TemplateProcessing(
            single=[*(tokens[i] for i in first), "$A", *(tokens[i] for i in last)],
            special_tokens=[(tokens[i], i) for i in dict.fromkeys(first + last)],
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok.to_str()


def _vocabulary(
    meta: Mapping[str, Any], path: Path, vocab: int
) -> tuple[list[str], list[tuple[str, str]]]:
    """The tokens (one per embedding row, each once) and the merges as pairs of them."""
    tokens = _strings(meta, path, "tokenizer.ggml.tokens")
    merges = _strings(meta, path, "tokenizer.ggml.merges")
    if len(tokens) != vocab:
        raise InputError(f"{path}: {len(tokens)} tokens for an embedding of {vocab} rows")
    known = set(tokens)
    if len(known) != len(tokens):
        raise InputError(f"{path}: tokenizer.ggml.tokens lists a token twice")
    pairs: list[tuple[str, str]] = []
    for merge in merges:  # "Ġ t": byte-level tokens never hold a space, so one splits them
        left, _, right = merge.partition(" ")
        if left not in known or right not in known:
            raise InputError(f"{path}: merge {merge!r} is not two tokens of the vocabulary")
        pairs.append((left, right))
    return tokens, pairs


def tokenizer_config_json(files: TokenizerFiles) -> str:
    return json.dumps(files.config, indent=2, ensure_ascii=False)


def _strings(meta: Mapping[str, Any], path: Path, key: str) -> list[str]:
    value = meta.get(key)
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise InputError(f"{path}: metadata {key} is missing or not a list of strings")
    return value


def _types(meta: Mapping[str, Any], path: Path, n: int) -> list[int]:
    """llama.cpp token types (1 normal, 3 control, 4 user-defined, ...); all normal if absent."""
    value = meta.get("tokenizer.ggml.token_type")
    if value is None:
        return [1] * n
    types = [int(t) for t in getattr(value, "tolist", lambda: value)()]
    if len(types) != n:
        raise InputError(
            f"{path}: tokenizer.ggml.token_type has {len(types)} entries for {n} tokens"
        )
    return types


def _token_id(meta: Mapping[str, Any], path: Path, which: str, vocab: int) -> int | None:
    value = meta.get(f"tokenizer.ggml.{which}_token_id")
    if value is None:
        return None
    if type(value) is not int or not 0 <= value < vocab:
        raise InputError(
            f"{path}: tokenizer.ggml.{which}_token_id must be a token id, got {value!r}"
        )
    return value


def _flag(meta: Mapping[str, Any], which: str) -> bool:
    return meta.get(f"tokenizer.ggml.{which}") is True
