"""Cut a loaded mlx-lm model down to this rank's tensor-parallel share, any share, exactly.

mlx-lm's `shard()` splits every width evenly; here each rank keeps the query heads, KV heads and
columns its `RankShare` names (topology/planning/tensor_shares.py), so any rank count and unequal
shares work. Layers that produce a slice ("all-to-sharded": q/k/v, gate/up) keep rows; layers
that consume one ("sharded-to-all": o, down) keep columns and all-sum their partial outputs. A
bias of a summed layer stays on rank 0 only, so it is added once. Quantized columns are cut in
whole groups. Every weight a share cuts (projections, experts, their scales, biases and sinks,
MLA's per-head maps or DeepSeek V2's kv_b_proj) is read from its file through SliceReader, only
the share's bytes; MLX would read a lazily loaded tensor whole before slicing it. A tensor the
files do not hold as loaded is still sliced from the lazy parameter, read whole: this is the
case for weights that mlx-lm's sanitize() makes, e.g. MLA's embed_q / unembed_out in a Hugging
Face DeepSeek-V3 / Kimi-K2 / GLM-4.7-Flash checkpoint, which holds kv_b_proj instead (the files
mlx-lm writes hold embed_q and unembed_out themselves). Weights stay lazy here; load.py
evaluates them layer by layer.

Qwen3.5's gated delta net layers are cut by whole key heads (the "linear" width names their value
columns): each rank keeps its key heads' query and key channels, their value heads, and those
heads' conv taps, gates and decay parameters, so its recurrent state is its own heads' only. Its
full-attention layers are cut as any other, q_proj's query-then-gate rows of a head kept together.
MiniMax's q_norm / k_norm span the whole projections: each rank keeps its heads' norm weights and
all-sums its squares (WidthNorm), a KV head held by several ranks counted on one of them.
Step-3.5's sliding layers may have head counts of their own: the grid then carries theirs
(HeadGrid.other) and the share its blocks of them (RankShare.other), which those layers are cut
by; its g_proj writes one gate logit per query head, so its rows follow the heads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from cluster import attention_blocks
from cluster.slice_reader import SliceReader
from topology.errors import InputError
from topology.planning.tensor_shares import HeadGrid, RankShare

Span = tuple[int, int]
SHARED = ("shared_experts", "shared_expert", "share_expert")  # the families' names for it


class SumOut(nn.Module):
    """A layer fed a slice of its input: every rank's partial output, all-summed."""

    def __init__(self, inner: nn.Module, group: Any) -> None:
        super().__init__()
        self.inner = inner
        self.group = group

    def __call__(self, x: mx.array) -> mx.array:
        return mx.distributed.all_sum(self.inner(x), group=self.group)


@dataclass(frozen=True)
class Counted:
    """The columns whose squares a rank adds to a whole-width norm's all-sum: its own heads,
    and of a KV head other ranks hold too only one rank's copy."""

    spans: tuple[Span, ...]


class WidthNorm(nn.Module):
    """An RMSNorm over a whole projection (MiniMax's q_norm and k_norm, one weight per column of
    every head) on a rank holding some of the heads: the squares of its counted columns are
    all-summed, so every rank divides by the same sum over the whole width."""

    def __init__(
        self, weight: mx.array, eps: float, width: int, counted: Counted | None, group: Any
    ) -> None:
        super().__init__()
        self.weight = weight
        self.eps = eps
        self.width = width  # the projection's whole width, every head once
        self.counted = counted  # None: every column held counts
        self.group = group

    def __call__(self, x: mx.array) -> mx.array:
        xf = x.astype(mx.float32)
        squares = xf.square()
        if self.counted is None:
            total = squares.sum(-1, keepdims=True)
        else:
            total = mx.zeros((*x.shape[:-1], 1), dtype=mx.float32)
            for a, b in self.counted.spans:
                total = total + squares[..., a:b].sum(-1, keepdims=True)
        total = mx.distributed.all_sum(total, group=self.group)
        return (xf * mx.rsqrt(total / self.width + self.eps) * self.weight).astype(x.dtype)


class _Source:
    """Where a layer's weights come from: read from their files (only the share) where the
    reader can, else sliced from the loaded (lazy) parameter."""

    def __init__(self, net: nn.Module, reader: SliceReader | None) -> None:
        self.reader = reader
        self.paths = {id(m): name for name, m in net.named_modules()} if reader else {}

    def rows(self, layer: nn.Module, name: str, rows: Sequence[int], axis: int = -2) -> mx.array:
        path = self.paths.get(id(layer))
        whole = layer[name]
        read = self.reader.rows(f"{path}.{name}", whole, rows, axis) if self.reader else None
        return read if read is not None else mx.take(whole, mx.array(list(rows)), axis=axis)

    def columns(self, layer: nn.Module, name: str, spans: Sequence[Span]) -> mx.array:
        path = self.paths.get(id(layer))
        read = self.reader.columns(f"{path}.{name}", layer[name], spans) if self.reader else None
        return read if read is not None else _take(layer[name], spans)


def shard_model(
    net: nn.Module,
    group: Any,
    share: RankShare,
    grid: HeadGrid,
    reader: SliceReader | None = None,
) -> None:
    """Replace every layer's attention and MLP weights by this rank's share, in place."""
    rank = group.rank()
    src = _Source(net, reader)
    for layer in net.model.layers:
        if getattr(layer, "is_linear", False):  # Qwen3.5's gated delta net
            _linear_attention(layer.linear_attn, share.widths["linear"], group, rank, src)
        elif grid.other is not None and getattr(layer.self_attn, "is_sliding", False):
            # Step-3.5's sliding layer with head counts of its own: its own blocks of them
            _attention(layer.self_attn, share.kind(True), grid.other, group, rank, src)
        else:
            _attention(layer.self_attn, share, grid, group, rank, src)
        mlp = layer.mlp if "mlp" in layer else layer.block_sparse_moe  # MiniMax's name
        _feed_forward(mlp, share, group, rank, src)


def _attention(
    attn: nn.Module, share: RankShare, grid: HeadGrid, group: Any, rank: int, src: _Source
) -> None:
    heads = share.heads(grid)
    if hasattr(attn, "kv_b_proj"):  # MLA as DeepSeek V2 runs it: one up-projection
        # kv_b_proj's rows are each head's key (nope part) then value rows, head after head
        _rows(attn.kv_b_proj, _blocks(heads, _out_dims(attn.kv_b_proj) // grid.heads), src)
    if hasattr(attn, "embed_q"):  # MLA (DeepSeek V3 / V3.2, Kimi K2, GLM-4.7-Flash): head maps
        # (heads, out, in) each: the share's heads along axis 0. A Hugging Face checkpoint holds
        # kv_b_proj instead, which sanitize() dequantizes, splits per head and (if it was
        # quantized) requantizes into these: the reader finds no such name and the heads are cut
        # from the lazy result, all of kv_b_proj read; reading only the heads' rows of kv_b_proj
        # would mean redoing sanitize() here.
        for part in (attn.embed_q, attn.unembed_out):
            for name in ("weight", "scales", "biases"):
                if name in part:
                    part[name] = src.rows(part, name, heads, axis=0)
    if hasattr(attn, "kv_lora_rank"):  # MLA: one latent "KV head" every rank holds whole
        # (as is DeepSeek V3.2's indexer, which picks the context from the whole queries' latent)
        q = attn.q_proj if attn.q_lora_rank is None else attn.q_b_proj
        _rows(q, _blocks(heads, _out_dims(q) // grid.heads), src)
        attn.num_heads = len(heads)
    else:
        q_rows = _out_dims(attn.q_proj) // grid.heads  # Qwen3.5: a head's query, then gate rows
        kv_rows = _out_dims(attn.k_proj) // grid.kv_heads
        _rows(attn.q_proj, _blocks(heads, q_rows), src)
        kv = share.kv_heads()
        for proj in (attn.k_proj, attn.v_proj):
            _rows(proj, _blocks(kv, kv_rows), src)
        if "g_proj" in attn:  # Step-3.5: one gate logit (a row) per query head
            _rows(attn.g_proj, heads, src)
        if _whole_width(attn, "q_norm", grid.heads * q_rows, q_rows):  # MiniMax
            attn.q_norm = _width_norm(attn, "q_norm", _blocks(heads, q_rows), None, group, src)
        if _whole_width(attn, "k_norm", grid.kv_heads * kv_rows, kv_rows):
            # A KV head several ranks hold counts once: on the rank holding its first query
            # head (exactly one rank does, as every query head is held once).
            spans, start = [], 0
            for (a, b), (c, _) in share.blocks:
                if c == 0:
                    spans.append((start, start + (b - a) * kv_rows))
                start += (b - a) * kv_rows
            counted = Counted(tuple(spans))
            attn.k_norm = _width_norm(attn, "k_norm", _blocks(kv, kv_rows), counted, group, src)
        if hasattr(attn, "sinks"):  # gpt-oss: one learned sink logit per head
            attn.sinks = src.rows(attn, "sinks", heads, axis=-1)
            attn.num_attention_heads, attn.num_key_value_heads = len(heads), len(kv)
            attn.num_key_value_groups = len(heads) // len(kv)
        elif hasattr(attn, "num_attention_heads"):  # Qwen3.5 (q_proj: query then gate rows)
            attn.num_attention_heads, attn.num_key_value_heads = len(heads), len(kv)
        elif hasattr(attn, "num_kv_heads"):  # Step-3.5
            attn.num_heads, attn.num_kv_heads = len(heads), len(kv)
        else:
            attn.n_heads, attn.n_kv_heads = len(heads), len(kv)
        if len(share.blocks) > 1:
            attention_blocks.install(attn, share.calls())
    per_head = _in_dims(attn.o_proj) // grid.heads
    _cols(attn.o_proj, _runs(heads, per_head), rank, src)
    attn.o_proj = SumOut(attn.o_proj, group)


def _linear_attention(lin: nn.Module, span: Span, group: Any, rank: int, src: _Source) -> None:
    """A gated delta net's share: the key heads whose value columns `span` names, each with its
    query and key channels and its group of value heads (mlx-lm's kernel pairs value head v
    with key head v // group, so a run of key heads carries a run of value heads)."""
    dk, dv = int(lin.head_k_dim), int(lin.head_v_dim)
    per_key = lin.num_v_heads // lin.num_k_heads  # value heads a key head carries
    first, last = span[0] // (per_key * dv), span[1] // (per_key * dv)
    keys, values = range(first, last), range(first * per_key, last * per_key)
    key_dim = int(lin.key_dim)
    # conv channels and in_proj_qkv rows: queries, then keys, then values, head after head
    channels = [
        *_blocks(keys, dk),
        *(key_dim + c for c in _blocks(keys, dk)),
        *(2 * key_dim + c for c in _blocks(values, dv)),
    ]
    _rows(lin.in_proj_qkv, channels, src)
    lin.conv1d.weight = src.rows(lin.conv1d, "weight", channels, axis=0)  # (channels, taps, 1)
    _rows(lin.in_proj_z, _blocks(values, dv), src)
    for proj in (lin.in_proj_b, lin.in_proj_a):  # one row per value head
        _rows(proj, list(values), src)
    for name in ("dt_bias", "A_log"):
        lin[name] = src.rows(lin, name, list(values), axis=-1)
    _cols(lin.out_proj, [span], rank, src)
    lin.out_proj = SumOut(lin.out_proj, group)
    lin.num_k_heads, lin.num_v_heads = len(keys), len(values)
    lin.key_dim, lin.value_dim = len(keys) * dk, len(values) * dv
    lin.conv_dim = len(channels)
    lin.conv1d.groups = len(channels)  # depthwise: one group per channel


def _whole_width(attn: nn.Module, name: str, width: int, per_head: int) -> bool:
    """Is attn.<name> an RMSNorm over the projection's whole width (not one head's)?"""
    norm = getattr(attn, name, None)
    return isinstance(norm, nn.RMSNorm) and norm.weight.shape[-1] == width != per_head


def _width_norm(
    attn: nn.Module,
    name: str,
    columns: Sequence[int],
    counted: Counted | None,
    group: Any,
    src: _Source,
) -> WidthNorm:
    norm = attn[name]
    width = int(norm.weight.shape[-1])
    weight = src.rows(norm, "weight", columns, axis=-1)
    return WidthNorm(weight, float(norm.eps), width, counted, group)


def _feed_forward(mlp: nn.Module, share: RankShare, group: Any, rank: int, src: _Source) -> None:
    experts = getattr(mlp, "switch_mlp", None) or getattr(mlp, "experts", None)
    if experts is None:  # a dense MLP
        _glu(mlp, share.widths["mlp"], rank, src)
        mlp.down_proj = SumOut(mlp.down_proj, group)
        return
    # Mixture of experts: mlx-lm's block all-sums routed and shared experts together.
    _glu(experts, share.widths["expert"], rank, src)
    shared = next((mlp[n] for n in SHARED if n in mlp), None)
    if shared is not None:
        _glu(shared, share.widths["shared"], rank, src)
    mlp.sharding_group = group


def _glu(block: nn.Module, span: Span, rank: int, src: _Source) -> None:
    rows = list(range(*span))
    _rows(block.gate_proj, rows, src)
    _rows(block.up_proj, rows, src)
    _cols(block.down_proj, [span], rank, src)


def _blocks(indices: Sequence[int], size: int) -> list[int]:
    """Rows (or columns) of the given heads, `size` each, in order."""
    return [i * size + j for i in indices for j in range(size)]


def _runs(heads: Sequence[int], size: int) -> list[Span]:
    """The heads' column blocks merged into runs of consecutive columns."""
    runs: list[Span] = []
    for h in heads:
        start, end = h * size, (h + 1) * size
        if runs and runs[-1][1] == start:
            runs[-1] = (runs[-1][0], end)
        else:
            runs.append((start, end))
    return runs


def _out_dims(layer: nn.Module) -> int:
    return int(layer.weight.shape[-2])


def _in_dims(layer: nn.Module) -> int:
    if "scales" in layer:
        return int(layer.scales.shape[-1] * layer.group_size)
    return int(layer.weight.shape[-1])


def _rows(layer: nn.Module, rows: Sequence[int], src: _Source) -> None:
    """Keep these output rows (of every expert, for switch layers)."""
    for name in ("weight", "scales", "biases"):
        if name in layer:
            layer[name] = src.rows(layer, name, rows)
    if "bias" in layer:
        layer["bias"] = src.rows(layer, "bias", rows, axis=-1)  # (experts x) out features


def _cols(layer: nn.Module, spans: Sequence[Span], rank: int, src: _Source) -> None:
    """Keep these input columns; quantized layers in whole groups. The bias stays on rank 0."""
    if "scales" in layer:
        group, bits = int(layer.group_size), int(layer.bits)
        if any(a % group or b % group for a, b in spans):
            raise InputError(
                f"tensor share cuts a quantization group of {group} columns ({list(spans)}): "
                "re-plan (the plan was made for another model)"
            )
        layer["weight"] = src.columns(
            layer, "weight", [(a * bits // 32, b * bits // 32) for a, b in spans]
        )
        for name in ("scales", "biases"):
            if name in layer:
                layer[name] = src.columns(layer, name, [(a // group, b // group) for a, b in spans])
    else:
        layer["weight"] = src.columns(layer, "weight", spans)
    if "bias" in layer and rank != 0:
        layer["bias"] = mx.zeros_like(layer["bias"])


def _take(weight: mx.array, spans: Sequence[Span]) -> mx.array:
    parts = [weight[..., a:b] for a, b in spans]
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1)
