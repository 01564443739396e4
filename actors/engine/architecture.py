"""The model's architecture (ModelArchitecture: its shapes and options), read from either
on-disk `config.json` form of the dual-AR family: the flat OpenAudio S1 form
(`model_type: "dual_ar"`) and the nested S2-Pro form (`model_type: "fish_qwen3_omni"`).
Defaults follow upstream fish-speech's model args."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as asked; the message names the file and key."""


FAMILY_S1 = "s1"
FAMILY_S2 = "s2"
MODEL_TYPE_FLAT = "dual_ar"
MODEL_TYPE_NESTED = "fish_qwen3_omni"


@dataclass
class ModelArchitecture:
    family: str  # "s1" (flat dual_ar) or "s2" (fish_qwen3_omni)
    vocab_size: int
    n_layer: int
    n_head: int
    n_local_heads: int
    dim: int
    head_dim: int
    intermediate_size: int
    rope_base: float
    norm_eps: float
    max_seq_len: int
    tie_word_embeddings: bool
    attention_qkv_bias: bool
    attention_o_bias: bool
    attention_qk_norm: bool
    codebook_size: int
    num_codebooks: int
    scale_codebook_embeddings: bool
    norm_fastlayer_input: bool
    n_fast_layer: int
    fast_dim: int
    fast_n_head: int
    fast_n_local_heads: int
    fast_head_dim: int
    fast_intermediate_size: int
    fast_attention_qkv_bias: bool
    fast_attention_qk_norm: bool
    fast_attention_o_bias: bool
    # Filled from the tokenizer (never trusted from config.json): inclusive id range.
    semantic_begin_id: int = 0
    semantic_end_id: int = 0

    def to_json_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def parameter_count(self) -> int:
        def block(dim, n_head, n_kv, head_dim, ffn, qkv_bias, o_bias, qk_norm):
            qkv = dim * (n_head + 2 * n_kv) * head_dim + (n_head + 2 * n_kv) * head_dim * qkv_bias
            wo = n_head * head_dim * dim + dim * o_bias
            norms = 2 * dim + 2 * head_dim * qk_norm
            return qkv + wo + 3 * dim * ffn + norms

        slow = self.n_layer * block(
            self.dim,
            self.n_head,
            self.n_local_heads,
            self.head_dim,
            self.intermediate_size,
            self.attention_qkv_bias,
            self.attention_o_bias,
            self.attention_qk_norm,
        )
        fast = self.n_fast_layer * block(
            self.fast_dim,
            self.fast_n_head,
            self.fast_n_local_heads,
            self.fast_head_dim,
            self.fast_intermediate_size,
            self.fast_attention_qkv_bias,
            self.fast_attention_o_bias,
            self.fast_attention_qk_norm,
        )
        embeds = (self.vocab_size + self.codebook_size * self.num_codebooks) * self.dim + self.dim
        output = 0 if self.tie_word_embeddings else self.vocab_size * self.dim
        project = (self.dim * self.fast_dim + self.fast_dim) if self.fast_dim != self.dim else 0
        fast_io = self.codebook_size * self.fast_dim * 2 + self.fast_dim
        return slow + fast + embeds + output + project + fast_io

    def slow_kv_bytes_per_token(self, bytes_per_element: int) -> int:
        return 2 * self.n_layer * self.n_local_heads * self.head_dim * bytes_per_element

    def fast_kv_bytes_per_frame(self, bytes_per_element: int) -> int:
        return (
            2
            * self.n_fast_layer
            * self.num_codebooks
            * self.fast_n_local_heads
            * self.fast_head_dim
            * bytes_per_element
        )


def _find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - (n % k)


class _Fields:
    """Typed reads from one JSON object with errors that name the file and the field."""

    def __init__(self, data: dict, source: str, prefix: str = ""):
        if not isinstance(data, dict):
            raise CheckpointError(f"{source}: {prefix or 'top level'} must be a JSON object")
        self.data, self.source, self.prefix = data, source, prefix

    def _name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def get(self, key: str, kind: type, default: Any = dataclasses.MISSING, allow_none=False):
        if key not in self.data or (self.data[key] is None and not allow_none):
            if default is dataclasses.MISSING:
                raise CheckpointError(f"{self.source}: required field '{self._name(key)}' is missing")
            return default
        value = self.data[key]
        if value is None:
            return None
        if kind is bool:
            if not isinstance(value, bool):
                raise CheckpointError(f"{self.source}: field '{self._name(key)}' must be true/false, got {value!r}")
            return value
        if kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise CheckpointError(f"{self.source}: field '{self._name(key)}' must be an integer, got {value!r}")
            return value
        if kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise CheckpointError(f"{self.source}: field '{self._name(key)}' must be a number, got {value!r}")
            return float(value)
        return value


def _flat_fields(f: _Fields) -> dict:
    """Slow-stack + codebook fields as upstream's BaseModelArgs reads them (same defaults)."""
    dim = f.get("dim", int)
    n_head = f.get("n_head", int)
    n_local = f.get("n_local_heads", int, -1)
    intermediate = f.get("intermediate_size", int, None)
    if intermediate is None:
        intermediate = _find_multiple(int(2 * 4 * dim / 3), 256)
    return dict(
        vocab_size=f.get("vocab_size", int),
        n_layer=f.get("n_layer", int),
        n_head=n_head,
        n_local_heads=n_head if n_local == -1 else n_local,
        dim=dim,
        # upstream's default when absent is 64, not dim // n_head
        head_dim=f.get("head_dim", int, 64),
        intermediate_size=intermediate,
        rope_base=f.get("rope_base", float, 10000.0),
        norm_eps=f.get("norm_eps", float, 1e-5),
        max_seq_len=f.get("max_seq_len", int, 2048),
        tie_word_embeddings=f.get("tie_word_embeddings", bool, True),
        attention_qkv_bias=f.get("attention_qkv_bias", bool, False),
        attention_o_bias=f.get("attention_o_bias", bool, False),
        attention_qk_norm=f.get("attention_qk_norm", bool, False),
    )


def _with_fast_defaults(cfg: dict, fast: dict) -> dict:
    """Fast fields left null (or 0, as upstream's `or` does) take the slow values."""

    def pick(name, slow_value):
        value = fast.get(name)
        return slow_value if value is None or value == 0 and not isinstance(value, bool) else value

    out = dict(cfg)
    out["fast_dim"] = pick("fast_dim", cfg["dim"])
    out["fast_n_head"] = pick("fast_n_head", cfg["n_head"])
    out["fast_n_local_heads"] = pick("fast_n_local_heads", cfg["n_local_heads"])
    out["fast_head_dim"] = pick("fast_head_dim", cfg["head_dim"])
    out["fast_intermediate_size"] = pick("fast_intermediate_size", cfg["intermediate_size"])
    for flag in ("attention_qkv_bias", "attention_qk_norm", "attention_o_bias"):
        value = fast.get("fast_" + flag)
        out["fast_" + flag] = cfg[flag] if value is None else value
    return out


def parse_config(data: dict, source: str = "config.json") -> ModelArchitecture:
    top = _Fields(data, source)
    model_type = top.get("model_type", str)
    if model_type == MODEL_TYPE_FLAT:
        cfg = _flat_fields(top)
        cfg.update(
            family=FAMILY_S1,
            codebook_size=top.get("codebook_size", int),
            num_codebooks=top.get("num_codebooks", int),
            scale_codebook_embeddings=top.get("scale_codebook_embeddings", bool, False),
            norm_fastlayer_input=top.get("norm_fastlayer_input", bool, False),
            n_fast_layer=top.get("n_fast_layer", int, 4),
        )
        fast = {
            name: top.get(name, int, None)
            for name in ("fast_dim", "fast_n_head", "fast_n_local_heads", "fast_head_dim", "fast_intermediate_size")
        }
        fast.update(
            {
                name: top.get(name, bool, None)
                for name in ("fast_attention_qkv_bias", "fast_attention_qk_norm", "fast_attention_o_bias")
            }
        )
        cfg = _with_fast_defaults(cfg, fast)
    elif model_type == MODEL_TYPE_NESTED:
        text = _Fields(top.get("text_config", dict), source, "text_config.")
        audio = _Fields(top.get("audio_decoder_config", dict), source, "audio_decoder_config.")
        cfg = _flat_fields(text)
        # S2 always scales codebook embeddings and feeds the final-norm output to the fast
        # stack; the fast stack reuses the text rope_base / norm_eps (upstream ignores the
        # audio_decoder_config values).
        cfg.update(
            family=FAMILY_S2,
            codebook_size=audio.get("vocab_size", int),
            num_codebooks=audio.get("num_codebooks", int),
            scale_codebook_embeddings=True,
            norm_fastlayer_input=True,
            n_fast_layer=audio.get("n_layer", int),
        )
        fast = dict(
            fast_dim=audio.get("dim", int, None),
            fast_n_head=audio.get("n_head", int, None),
            fast_n_local_heads=audio.get("n_local_heads", int, None),
            fast_head_dim=audio.get("head_dim", int, None),
            fast_intermediate_size=audio.get("intermediate_size", int, None),
            fast_attention_qkv_bias=audio.get("attention_qkv_bias", bool, None),
            fast_attention_qk_norm=audio.get("attention_qk_norm", bool, None),
            fast_attention_o_bias=audio.get("attention_o_bias", bool, None),
        )
        cfg = _with_fast_defaults(cfg, fast)
    else:
        raise CheckpointError(
            f"{source}: field 'model_type' is {model_type!r}; chorus loads "
            f"'{MODEL_TYPE_FLAT}' (OpenAudio S1) and '{MODEL_TYPE_NESTED}' (S2-Pro) checkpoints"
        )
    config = ModelArchitecture(**cfg)
    _check_shapes(config, source)
    return config


def _check_shapes(c: ModelArchitecture, source: str) -> None:
    positive = (
        "vocab_size",
        "n_layer",
        "n_head",
        "n_local_heads",
        "dim",
        "head_dim",
        "intermediate_size",
        "max_seq_len",
        "codebook_size",
        "num_codebooks",
        "n_fast_layer",
        "fast_dim",
        "fast_n_head",
        "fast_n_local_heads",
        "fast_head_dim",
        "fast_intermediate_size",
    )
    for name in positive:
        if getattr(c, name) <= 0:
            raise CheckpointError(f"{source}: field '{name}' must be positive, got {getattr(c, name)}")
    if c.n_head % c.n_local_heads:
        raise CheckpointError(f"{source}: n_head ({c.n_head}) is not a multiple of n_local_heads ({c.n_local_heads})")
    if c.fast_n_head % c.fast_n_local_heads:
        raise CheckpointError(
            f"{source}: fast_n_head ({c.fast_n_head}) is not a multiple of fast_n_local_heads ({c.fast_n_local_heads})"
        )
    for name in ("head_dim", "fast_head_dim"):
        if getattr(c, name) % 2:
            raise CheckpointError(f"{source}: field '{name}' must be even for RoPE, got {getattr(c, name)}")
    if c.num_codebooks < 1:
        raise CheckpointError(f"{source}: num_codebooks must be >= 1")


def load_config(checkpoint_dir: str | Path) -> ModelArchitecture:
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(
            f"{path}: not found (a checkpoint directory holds config.json, the weights and the tokenizer files)"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    return parse_config(data, str(path))


def with_semantic_ids(config: ModelArchitecture, begin: int, end: int, source: str) -> ModelArchitecture:
    """Attach the tokenizer's semantic id range and check it against the model's shapes."""
    if end >= config.vocab_size:
        raise CheckpointError(f"{source}: semantic id {end} is outside vocab_size {config.vocab_size}")
    return dataclasses.replace(config, semantic_begin_id=begin, semantic_end_id=end)
