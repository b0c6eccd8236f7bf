"""`--draft-model`: checked before anything launches, from its tokenizer and config files only.

Drafts are token ids the target checks, so a draft model must give every token the id the
target gives it: the two tokenizers' vocabularies (tokenizer.json's model vocabulary and added
tokens) must agree on every id they share, and the draft's ids must fit the target's embedding.
Without a tokenizer.json on either side the configs' vocab_size must be equal.
"""

from __future__ import annotations

from pathlib import Path

from launcher.planning.model_source import (
    CONFIG,
    MAX_CONFIG_BYTES,
    hub_file,
    read_json,
    resolve_model,
)
from topology.errors import InputError

TOKENIZER = "tokenizer.json"
MAX_TOKENIZER_BYTES = 64 << 20  # the largest vocabularies' files are ~20 MB


def _file(model: str, name: str, required: bool) -> Path | None:
    src = resolve_model(model)
    if src.kind == "dir":
        path = Path(src.id) / name
        if path.is_file():
            return path
        if required:
            raise InputError(f"--draft-model {model}: no {name} in {src.id}")
        return None
    return hub_file(src.id, name, required)


def _vocab(path: Path, label: str) -> dict[int, str]:
    """id -> token of a tokenizer.json (BPE/WordPiece: a token -> id map; Unigram: a list)."""
    raw = read_json(path, label, MAX_TOKENIZER_BYTES)
    model = raw.get("model") if isinstance(raw, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    out: dict[int, str] = {}
    if isinstance(vocab, dict):
        out = {i: t for t, i in vocab.items() if isinstance(i, int)}
    elif isinstance(vocab, list):
        out = {i: p[0] for i, p in enumerate(vocab) if isinstance(p, list) and p}
    added = raw.get("added_tokens") if isinstance(raw, dict) else None
    for a in added if isinstance(added, list) else []:
        if isinstance(a, dict) and isinstance(a.get("id"), int):
            out[a["id"]] = str(a.get("content"))
    if not out:
        raise InputError(f"{label}: holds no vocabulary")
    return out


def _vocab_size(model: str, label: str) -> int:
    config = read_json(_file(model, CONFIG, True) or Path(), label, MAX_CONFIG_BYTES)
    size = config.get("vocab_size") if isinstance(config, dict) else None
    if not isinstance(size, int):  # multimodal configs keep it in their text part
        text = config.get("text_config") if isinstance(config, dict) else None
        size = text.get("vocab_size") if isinstance(text, dict) else None
    if not isinstance(size, int) or size <= 0:
        raise InputError(f"{label}: has no vocab_size")
    return size


def check_draft_model(model: str, draft: str) -> str:
    """The draft model as the ranks should load it (a folder as an absolute path); InputError
    (one line: exit 2) when it is missing or its vocabulary is not the target's."""
    if not draft.strip():
        raise InputError("--draft-model: give a model directory or a Hugging Face repo id")
    try:
        src = resolve_model(draft)
    except InputError as e:  # its wording names --model
        raise InputError(str(e).replace("--model", "--draft-model", 1)) from None
    target_size = _vocab_size(model, f"--model {model}: {CONFIG}")
    draft_size = _vocab_size(draft, f"--draft-model {draft}: {CONFIG}")
    ours, theirs = _file(model, TOKENIZER, False), _file(draft, TOKENIZER, False)
    if ours is None or theirs is None:
        if draft_size != target_size:
            raise InputError(
                f"--draft-model {draft}: its vocabulary ({draft_size} tokens) is not the "
                f"target's ({target_size}): pick a draft model of the same family"
            )
        return src.id
    mine = _vocab(ours, f"--model {model}: {TOKENIZER}")
    other = _vocab(theirs, f"--draft-model {draft}: {TOKENIZER}")
    differ = sorted(i for i in mine.keys() & other.keys() if mine[i] != other[i])
    beyond = sorted(i for i in other if i >= target_size)
    if differ or beyond:
        what = (
            f"token {differ[0]} is {other[differ[0]]!r} there and {mine[differ[0]]!r} in the "
            f"target ({len(differ)} ids differ)"
            if differ
            else f"its token ids reach {beyond[-1]}, past the target's {target_size}"
        )
        raise InputError(
            f"--draft-model {draft}: its vocabulary is not the target's: {what}; pick a draft "
            "model of the same family"
        )
    return src.id
