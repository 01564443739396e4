"""The dual-AR transformer (slow + fast stack), gpt-fast style: plain modules, a functional
KV cache handed in by the caller, numerics matching upstream fish-speech (docs/architecture.md §5).

Shapes: B rows, T new columns, C = num_codebooks, S = cache capacity per slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..modules import FeedForward, RMSNorm, apply_rope, rope_rotation, uninitialised_embedding
from .architecture import ModelArchitecture
from .attention import attend, attend_reached_op
from .kernels.stack import TokenView, finish, fused_layers


class HeadRMSNorm(nn.Module):
    """q/k norm: torch's nn.RMSNorm semantics (computed in the input dtype)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _same_device(a: torch.device, b: torch.device) -> bool:
    """`cuda` and `cuda:0` (the current device) are one device; torch.device's == says not."""
    if a.type != b.type:
        return False
    if a.type != "cuda" or a.index == b.index:
        return True
    current = torch.cuda.current_device()
    return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)


def _path(fused) -> str:
    """forward_slow/forward_fast's `fused` as a kernels.kernel_path: True or "fused" -> the fused
    ops; "compiled" -> their references through inductor; False, None or "eager" -> the modules."""
    if fused is True:
        return "fused"
    return "eager" if not fused else str(fused)


@dataclass
class LayerKV:
    """One layer's cache: k, v [slots, n_kv_heads, S, head_dim]."""

    k: Tensor
    v: Tensor


@dataclass
class CacheView:
    """Where a forward call reads and writes K/V.

    layers: per-layer caches. rows: slot ids of the batch rows, either a `slice` of
    consecutive slots (read as a view: no copy) or an int64 tensor [B]. positions: [B, T]
    absolute positions of the new columns. attend_len: keys 0..attend_len-1 are read (the
    longest row's real length, or the full capacity when shapes must stay static). reach: a
    static CPU frame's key count as a 0-d tensor, read at run time (attention.attend_reached):
    then only keys 0..reach-1 are read whatever attend_len is."""

    layers: list[LayerKV]
    rows: object
    positions: Tensor
    attend_len: int
    reach: Optional[Tensor] = None
    # set when every row writes one column at the same position and `rows` is a slice (the
    # fast stack's decode): the write is then a plain strided copy instead of a scatter
    same_position: Optional[int] = None


class Attention(nn.Module):
    def __init__(self, dim, n_head, n_kv, head_dim, qkv_bias, o_bias, qk_norm, eps):
        super().__init__()
        self.n_head, self.n_kv, self.head_dim = n_head, n_kv, head_dim
        self.wqkv = nn.Linear(dim, (n_head + 2 * n_kv) * head_dim, bias=qkv_bias)
        self.wo = nn.Linear(n_head * head_dim, dim, bias=o_bias)
        if qk_norm:
            self.q_norm = HeadRMSNorm(head_dim, eps)
            self.k_norm = HeadRMSNorm(head_dim, eps)
        self.qk_norm = qk_norm

    def forward(
        self,
        x: Tensor,
        rotation: Tensor,
        mask: Optional[Tensor],
        cache: Optional[LayerKV] = None,
        view: Optional[CacheView] = None,
    ) -> Tensor:
        b, t, _ = x.shape
        q_size, kv_size = self.n_head * self.head_dim, self.n_kv * self.head_dim
        q, k, v = self.wqkv(x).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(b, t, self.n_head, self.head_dim)
        k = k.view(b, t, self.n_kv, self.head_dim)
        v = v.view(b, t, self.n_kv, self.head_dim)
        if self.qk_norm:  # before RoPE, as upstream
            q, k = self.q_norm(q), self.k_norm(k)
        # one rotation for the query and key heads together: half the element-wise calls
        q, k = apply_rope(torch.cat([q, k], dim=2), rotation).split([self.n_head, self.n_kv], dim=2)
        if cache is not None:
            rows = view.rows
            if view.same_position is not None:
                cache.k[rows, :, view.same_position] = k[:, 0]
                cache.v[rows, :, view.same_position] = v[:, 0]
            else:
                slot_ids = torch.arange(rows.start, rows.stop, device=x.device) if isinstance(rows, slice) else rows
                # cache[slot, :, pos] <- new K/V (advanced indices first: [B, T, Hkv, D])
                cache.k[slot_ids[:, None], :, view.positions] = k
                cache.v[slot_ids[:, None], :, view.positions] = v
            if view.reach is not None:
                y = attend_reached_op(q.transpose(1, 2), cache.k[rows], cache.v[rows], view.positions, view.reach)
                return self.wo(y.transpose(1, 2).reshape(b, t, q_size))
            # a slice of consecutive slots reads a view; a tensor of slot ids gathers a copy
            keys = cache.k[rows, :, : view.attend_len]
            values = cache.v[rows, :, : view.attend_len]
        else:
            keys, values = k.transpose(1, 2), v.transpose(1, 2)
        y = attend(q.transpose(1, 2), keys, values, mask)
        return self.wo(y.transpose(1, 2).reshape(b, t, q_size))


class TransformerBlock(nn.Module):
    def __init__(self, dim, n_head, n_kv, head_dim, ffn, qkv_bias, o_bias, qk_norm, eps):
        super().__init__()
        self.attention = Attention(dim, n_head, n_kv, head_dim, qkv_bias, o_bias, qk_norm, eps)
        self.feed_forward = FeedForward(dim, ffn)
        self.attention_norm = RMSNorm(dim, eps)
        self.ffn_norm = RMSNorm(dim, eps)

    def forward(self, x, rotation, mask, cache=None, view=None):
        h = x + self.attention(self.attention_norm(x), rotation, mask, cache, view)
        return h + self.feed_forward(self.ffn_norm(h))


@dataclass
class SlowOutput:
    logits: Optional[Tensor]  # [B, T', V'] (T' = 1 when last_only; V' = len(logit_rows) when given)
    hidden: Tensor  # [B, T', fast_dim]: what the fast stack's position 0 receives


class DualARModel(nn.Module):
    def __init__(self, config: ModelArchitecture):
        super().__init__()
        c = self.config = config
        self.embeddings = uninitialised_embedding(c.vocab_size, c.dim)
        self.codebook_embeddings = uninitialised_embedding(c.codebook_size * c.num_codebooks, c.dim)
        self.layers = nn.ModuleList(
            TransformerBlock(
                c.dim,
                c.n_head,
                c.n_local_heads,
                c.head_dim,
                c.intermediate_size,
                c.attention_qkv_bias,
                c.attention_o_bias,
                c.attention_qk_norm,
                c.norm_eps,
            )
            for _ in range(c.n_layer)
        )
        self.norm = RMSNorm(c.dim, c.norm_eps)
        if not c.tie_word_embeddings:
            self.output = nn.Linear(c.dim, c.vocab_size, bias=False)
        if c.fast_dim != c.dim:
            self.fast_project_in = nn.Linear(c.dim, c.fast_dim)
        self.fast_embeddings = uninitialised_embedding(c.codebook_size, c.fast_dim)
        self.fast_layers = nn.ModuleList(
            TransformerBlock(
                c.fast_dim,
                c.fast_n_head,
                c.fast_n_local_heads,
                c.fast_head_dim,
                c.fast_intermediate_size,
                c.fast_attention_qkv_bias,
                c.fast_attention_o_bias,
                c.fast_attention_qk_norm,
                c.norm_eps,
            )
            for _ in range(c.n_fast_layer)
        )
        self.fast_norm = RMSNorm(c.fast_dim, c.norm_eps)
        self.fast_output = nn.Linear(c.fast_dim, c.codebook_size, bias=False)
        self._rope_slow: Optional[Tensor] = None
        self._rope_fast: Optional[Tensor] = None
        self._row_index: Optional[Tensor] = None  # 0, 1, 2, ...: batch rows' slots (row_slots)
        self._codebook_offsets: Optional[Tensor] = None  # codebook i's row offset i * codebook_size

    # -- tables -------------------------------------------------------------------------
    def _slow_rope(self, n_positions: int, device) -> Tensor:
        table, device = self._rope_slow, torch.device(device)
        here = table is not None and _same_device(table.device, device)
        if not here or table.shape[0] < n_positions:
            # grow geometrically so long runs do not rebuild the table every step
            size = max(n_positions, 2 * table.shape[0] if here else 0, 256)
            self._rope_slow = rope_rotation(size, self.config.head_dim, self.config.rope_base, device)
        return self._rope_slow

    def _fast_rope(self, device) -> Tensor:
        if self._rope_fast is None or not _same_device(self._rope_fast.device, torch.device(device)):
            self._rope_fast = rope_rotation(
                self.config.num_codebooks, self.config.fast_head_dim, self.config.rope_base, device
            )
        return self._rope_fast

    # -- slow stack ---------------------------------------------------------------------
    def embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, 1+C, T] -> x [B, T, dim] (the inference embedding rule, docs/architecture.md §5.6)."""
        c = self.config
        main = tokens[:, 0]
        codes = tokens[:, 1:].transpose(1, 2) + self.codebook_offsets(
            tokens.device
        )  # [B, T, C]: codebook i at row offset i*cb
        codebook_sum = self.codebook_embeddings(codes).sum(dim=2)
        semantic = (main >= c.semantic_begin_id) & (main <= c.semantic_end_id)
        x = self.embeddings(main) + codebook_sum * semantic.unsqueeze(-1).to(codebook_sum.dtype)
        if c.scale_codebook_embeddings:
            x = torch.where(semantic.unsqueeze(-1), x / math.sqrt(c.num_codebooks + 1), x)
        return x

    def forward_slow(
        self,
        tokens: Tensor,
        positions: Tensor,
        cache: Optional[list[LayerKV]] = None,
        rows=None,
        attend_len: int = 0,
        last_only: bool = True,
        logit_rows: Optional[Tensor] = None,
        want_logits: bool = True,
        logit_head: Optional[nn.Module] = None,
        select: Optional[Tensor] = None,
        reach: Optional[Tensor] = None,
        fused=False,
        slots: Optional[Tensor] = None,
    ) -> SlowOutput:
        """tokens [B, 1+C, T]; positions [B, T] absolute positions of the columns.

        Without a cache the call is a full causal recompute of exactly these columns (the
        uncached reference path; positions must then be 0..T-1). With a cache the new K/V
        are written to slots `rows` at `positions` (all < attend_len) and queries attend to
        keys 0..attend_len-1 of their slot (0..reach-1 when `reach` is given: CacheView), masked to
        key position <= query position.

        `fused` (with a cache: "fused" or "compiled", kernels.kernel_path; True is "fused") runs the
        blocks through kernels/stack.py: each token attends to its own slot's keys 0..position, no
        mask, no key count. `slots` [B, T] then names each token's slot (a packed prefill of several
        rows in one sequence); else every token of batch row i is in slot `rows`[i]."""
        b, _, t = tokens.shape
        x = self.embed(tokens)
        if _path(fused) != "eager" and cache is not None:
            if slots is None:
                slots = self.row_slots(rows, b, x.device).unsqueeze(1).expand(b, t)
            x, normed = self._fused_slow(x, positions, cache, slots, attend_len, select, last_only, _path(fused))
            return self._slow_output(x, normed, want_logits, logit_head, logit_rows)
        # every position is below attend_len (cached) or T (uncached, positions from 0): the
        # table size is known without reading `positions`, so compiled steps never sync
        n_pos = t if cache is None else attend_len
        rotation = self._slow_rope(n_pos, x.device)[positions]
        key_pos, view = positions, None  # [B, T], uncached
        if cache is not None:
            key_pos = torch.arange(attend_len, device=x.device).expand(b, attend_len)
            view = CacheView(cache, rows, positions, attend_len, reach)
        mask = key_pos.unsqueeze(1) <= positions.unsqueeze(2)  # [B, T, L]
        for i, layer in enumerate(self.layers):
            x = layer(x, rotation, mask, None if cache is None else cache[i], view)
        if select is not None:  # one column per row (its last real one in a padded batch)
            x = x[torch.arange(b, device=x.device), select].unsqueeze(1)
        elif last_only and t > 1:
            x = x[:, -1:]
        return self._slow_output(x, self.norm(x), want_logits, logit_head, logit_rows)

    def _fused_slow(self, x, positions, cache, slots, attend_len, select, last_only, path) -> tuple[Tensor, Tensor]:
        """forward_slow's blocks through the kernels package's stack: (the kept columns' residual
        stream, their final norm), each token attending to its own slot's keys."""
        b, t = x.shape[0], x.shape[1]
        view = TokenView(slots.reshape(-1), positions.reshape(-1), self._slow_rope(attend_len, x.device), path)
        x, delta = fused_layers(self.layers, x, cache, view)
        if select is not None:
            pick = torch.arange(b, device=x.device), select
            x, delta = x[pick].unsqueeze(1), delta[pick].unsqueeze(1)
        elif last_only and t > 1:
            x, delta = x[:, -1:], delta[:, -1:]
        return finish(x, delta, self.norm, view.path)

    def _slow_output(self, x, normed, want_logits, logit_head, logit_rows) -> SlowOutput:
        logits = None
        if want_logits and logit_head is not None:
            logits = logit_head(normed)
        elif want_logits:
            logits = F.linear(normed, self.output_rows(logit_rows))
        hidden = normed if self.config.norm_fastlayer_input else x
        return SlowOutput(logits=logits, hidden=self.project_to_fast(hidden))

    def codebook_offsets(self, device) -> Tensor:
        """Codebook i's first row in codebook_embeddings (i * codebook_size), kept on the model."""
        offsets, c = self._codebook_offsets, self.config
        if offsets is None or not _same_device(offsets.device, torch.device(device)):
            with torch.inference_mode(False), torch.no_grad():
                offsets = torch.arange(c.num_codebooks, device=device) * c.codebook_size
            self._codebook_offsets = offsets
        return offsets

    def row_slots(self, rows, b: int, device) -> Tensor:
        """The slot of each of `b` batch rows as int64 [b]: `rows` itself, or a view of a table
        kept on the model (no launch: a captured step reads it as a static tensor)."""
        if not isinstance(rows, slice):
            return rows
        table = self._row_index
        if table is None or table.shape[0] < rows.stop or not _same_device(table.device, torch.device(device)):
            with torch.inference_mode(False), torch.no_grad():
                self._row_index = torch.arange(
                    max(rows.stop, 2 * (0 if table is None else table.shape[0]), 64), device=device
                )
        return self._row_index[rows]

    def output_rows(self, rows: Optional[Tensor] = None) -> Tensor:
        """The output matrix (tied embeddings or `output`), or only the given vocabulary rows."""
        weight = self.embeddings.weight if self.config.tie_word_embeddings else self.output.weight
        return weight if rows is None else weight[rows]

    def candidate_head(self, rows: Tensor) -> nn.Linear:
        """A Linear over just the given vocabulary rows: decoding samples only semantic ids and
        <|im_end|>, so it needs ~4k of the output matrix's rows (all 155k for `score`)."""
        w = self.output_rows(rows)
        with torch.device("meta"):
            head = nn.Linear(w.shape[1], w.shape[0], bias=False)
        head.weight = nn.Parameter(w.detach().clone(), requires_grad=False)
        return head

    def project_to_fast(self, hidden: Tensor) -> Tensor:
        if self.config.fast_dim != self.config.dim:
            return self.fast_project_in(hidden)
        return hidden

    # -- fast stack ---------------------------------------------------------------------
    def forward_fast(
        self, x: Tensor, start: int = 0, cache: Optional[list[LayerKV]] = None, rows=None, want_logits: bool = True,
        fused: bool = False,
    ) -> Optional[Tensor]:  # fmt: skip
        """Fast-stack logits [B, T, codebook_size] for inputs x [B, T, fast_dim] at frame
        positions start..start+T-1. Without a cache: a full causal pass (T = C for the
        teacher-forced score path). With a cache: K/V of this frame live in slots `rows`.
        want_logits=False (a frame's position 0, whose head nobody samples) skips the final norm
        and the head: the call only writes its K/V. `fused`: the fused kernels (forward_slow)."""
        b, t, _ = x.shape
        table = self._fast_rope(x.device)
        if _path(fused) != "eager" and cache is not None:
            slots = self.row_slots(rows, b, x.device).unsqueeze(1).expand(b, t).reshape(-1)
            positions = self.row_slots(slice(start, start + t), t, x.device).expand(b, t).reshape(-1)
            view = TokenView(slots, positions, table, _path(fused))
            x, delta = fused_layers(self.fast_layers, x, cache, view)
            return self.fast_output(finish(x, delta, self.fast_norm, view.path)[1]) if want_logits else None
        positions = torch.arange(start, start + t, device=x.device).expand(b, t)
        rotation = table[start : start + t].unsqueeze(0)  # the same positions for every row
        same = start if (cache is not None and t == 1 and isinstance(rows, slice)) else None
        view = None if cache is None else CacheView(cache, rows, positions, start + t, same_position=same)
        if cache is not None and t == 1:
            mask = None  # one new column attends to every key of its frame so far
        else:
            key_pos = positions if cache is None else torch.arange(start + t, device=x.device).expand(b, start + t)
            mask = key_pos.unsqueeze(1) <= positions.unsqueeze(2)
        for i, layer in enumerate(self.fast_layers):
            x = layer(x, rotation, mask, None if cache is None else cache[i], view)
        return self.fast_output(self.fast_norm(x)) if want_logits else None

    def fast_codebook_input(self, codes: Tensor) -> Tensor:
        """fast_embeddings of the previous codebook's codes [B] -> [B, 1, fast_dim]."""
        return self.fast_embeddings(codes).unsqueeze(1)

    # -- the uncached reference: one call, no cache, every position -----------------------
    @torch.inference_mode()
    def score(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Teacher-forced logits of one token matrix [1+C, T]: slow [T, vocab] at every
        position and fast [T, C, codebook_size] where entry t is the fast stack fed the
        hidden of column t then codes 0..C-2 of column t+1 (last column zeros)."""
        c = self.config
        tokens = tokens.unsqueeze(0)
        t = tokens.shape[-1]
        positions = torch.arange(t, device=tokens.device).unsqueeze(0)
        out = self.forward_slow(tokens, positions, last_only=False)
        slow = out.logits[0]
        fast = torch.zeros(t, c.num_codebooks, c.codebook_size, dtype=slow.dtype, device=slow.device)
        if t > 1:
            hidden = out.hidden[0, : t - 1].unsqueeze(1)  # [T-1, 1, fast_dim]
            next_codes = tokens[0, 1 : c.num_codebooks, 1:].T  # [T-1, C-1]: codes 0..C-2 of column t+1
            x = torch.cat([hidden, self.fast_embeddings(next_codes)], dim=1)
            fast[: t - 1] = self.forward_fast(x)
        return slow, fast
