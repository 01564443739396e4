"""Deterministic random checkpoints in the REAL on-disk formats, written with the same
writers a user's conversion uses (torch.save state dict for S1, safetensors shards + index
for S2), plus a byte-level tokenizer in both tiktoken and HF form. The demo and most tests
run on these; `bench` builds bigger shapes in memory with `random_model`.

The byte-level tokenizer: ids 0..255 are the UTF-8 bytes, then the special tokens in
`SPECIAL_TOKENS` order, then <|semantic:0..codebook_size-1|>."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import torch

from ..precision import choose_dtype
from .architecture import (
    FAMILY_S1,
    FAMILY_S2,
    MODEL_TYPE_FLAT,
    MODEL_TYPE_NESTED,
    parse_config,
    with_semantic_ids,
)
from .checkpoint import INDEX_FILE, PTH_FILE, s2_stored_name
from .loader import LoadedModel, build_empty_model, resolve_device
from .tokenizer import IM_END, IM_START, INTERLEAVE, SEMANTIC_TEMPLATE, VOICE, Tokenizer

SPECIAL_TOKENS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<|pad|>",
    IM_START,
    IM_END,
    "<|phoneme_start|>",
    "<|phoneme_end|>",
    "<|tool_call_start|>",
    "<|tool_call_end|>",
    "<|text|>",
    VOICE,
    INTERLEAVE,
    "<|audio_start|>",
    "<|audio_end|>",
    "<|audio|>",
    "<|audio_pad|>",
]

# Named shapes. `small` is S1-mini cut to 12 slow layers (fits a 2-core machine);
# `s1-mini` is the full S1-mini shape.
SIZES = {
    "tiny": dict(
        n_layer=2,
        dim=128,
        n_head=4,
        n_local_heads=2,
        head_dim=32,
        intermediate_size=384,
        n_fast_layer=2,
        fast_head_dim=32,
        num_codebooks=10,
        codebook_size=128,
        vocab_size=None,
    ),
    "small": dict(
        n_layer=12,
        dim=1024,
        n_head=16,
        n_local_heads=8,
        head_dim=128,
        intermediate_size=3072,
        n_fast_layer=4,
        fast_head_dim=64,
        num_codebooks=10,
        codebook_size=4096,
        vocab_size=155776,
    ),
}
SIZES["s1-mini"] = dict(SIZES["small"], n_layer=28)  # S1-mini's shapes: "small" with its 28 layers
# S2-Pro's shapes (its config.json: 36 slow layers of 2560 with 32/8 heads of 128 and a
# 9728-wide SwiGLU; the fast stack 4 such layers; 10 codebooks of 4096)
SIZES["s2-pro"] = dict(
    n_layer=36,
    dim=2560,
    n_head=32,
    n_local_heads=8,
    head_dim=128,
    intermediate_size=9728,
    n_fast_layer=4,
    fast_head_dim=128,
    num_codebooks=10,
    codebook_size=4096,
    vocab_size=155776,
)
# the format each named shape is built in (the rest: S1's flat form)
SIZE_FORMATS = {"s2-pro": FAMILY_S2}


def special_tokens(codebook_size: int) -> dict[str, int]:
    names = SPECIAL_TOKENS + [SEMANTIC_TEMPLATE.format(i) for i in range(codebook_size)]
    return {name: 256 + i for i, name in enumerate(names)}


class SyntheticTokenizer(Tokenizer):
    """The byte-level tokenizer in memory (no files): for shapes built by `random_model`."""

    kind = "bytes"

    def __init__(self, codebook_size: int):
        super().__init__(special_tokens(codebook_size), "<synthetic byte tokenizer>")
        self.vocab_size = 256 + len(self.special)
        self._by_len = sorted(self.special, key=len, reverse=True)

    def encode(self, text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            if text.startswith("<|", i):
                hit = next((s for s in self._by_len if text.startswith(s, i)), None)
                if hit:
                    ids.append(self.special[hit])
                    i += len(hit)
                    continue
            ids.extend(text[i].encode("utf-8"))
            i += 1
        return ids


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable-unicode table used by HF ByteLevel tokenizers."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def write_tokenizer(out_dir: Path, codebook_size: int, tiktoken_files: bool = True) -> None:
    """tokenizer.json (+ tokenizer_config.json) always; tokenizer.tiktoken + special_tokens.json
    for the S1 form."""
    from tokenizers import AddedToken, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTok

    special = special_tokens(codebook_size)
    byte_map = _byte_to_unicode()
    vocab = {byte_map[b]: b for b in range(256)}
    tok = HFTok(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "pad_token": "<|pad|>"},
            indent=2,
        )
        + "\n"
    )
    if tiktoken_files:
        lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
        (out_dir / "tokenizer.tiktoken").write_text("\n".join(lines) + "\n")
        (out_dir / "special_tokens.json").write_text(json.dumps(special, indent=2) + "\n")


def config_dict(fmt: str, sizes: dict, max_seq_len: int) -> dict:
    """config.json content in the flat S1 or nested S2 form."""
    slow = _slow_transformer(sizes, max_seq_len)
    fast_dim = sizes.get("fast_dim") or sizes["dim"]
    if fmt == FAMILY_S1:
        return _flat_s1_config(slow, sizes, fast_dim)
    if fmt == FAMILY_S2:
        return _nested_s2_config(slow, sizes, fast_dim)
    raise ValueError(f"format must be 's1' or 's2', got {fmt!r}")


def _slow_transformer(sizes: dict, max_seq_len: int) -> dict:
    """The slow transformer's keys, which both forms spell alike (S2 nests them in text_config)."""
    n_special = len(SPECIAL_TOKENS) + sizes["codebook_size"]
    vocab = sizes.get("vocab_size") or 256 + n_special
    return dict(
        vocab_size=vocab,
        n_layer=sizes["n_layer"],
        n_head=sizes["n_head"],
        n_local_heads=sizes["n_local_heads"],
        head_dim=sizes["head_dim"],
        dim=sizes["dim"],
        intermediate_size=sizes["intermediate_size"],
        rope_base=1000000.0,
        norm_eps=1e-6,
        max_seq_len=max_seq_len,
        dropout=0.0,
        tie_word_embeddings=True,
        attention_qkv_bias=False,
        attention_o_bias=False,
        attention_qk_norm=True,
    )


def _flat_s1_config(slow: dict, sizes: dict, fast_dim: int) -> dict:
    """The S1 form: one flat dict, the fast transformer's keys prefixed `fast_`."""
    return dict(
        model_type=MODEL_TYPE_FLAT,
        **slow,
        codebook_size=sizes["codebook_size"],
        num_codebooks=sizes["num_codebooks"],
        scale_codebook_embeddings=True,
        n_fast_layer=sizes["n_fast_layer"],
        fast_dim=fast_dim,
        fast_n_head=sizes["n_head"],
        fast_n_local_heads=sizes["n_local_heads"],
        fast_head_dim=sizes["fast_head_dim"],
        fast_intermediate_size=sizes["intermediate_size"],
        fast_attention_qkv_bias=False,
        fast_attention_qk_norm=True,
        fast_attention_o_bias=False,
    )


def _nested_s2_config(slow: dict, sizes: dict, fast_dim: int) -> dict:
    """The S2 form: the token ids at the top, the slow transformer in text_config and the fast
    one in audio_decoder_config."""
    special = special_tokens(sizes["codebook_size"])
    return dict(
        architectures=["FishQwen3OmniForCausalLM"],
        model_type=MODEL_TYPE_NESTED,
        dtype="bfloat16",
        sample_rate=44100,
        eos_token_id=special[IM_END],
        pad_token_id=special["<|pad|>"],
        semantic_start_token_id=special[SEMANTIC_TEMPLATE.format(0)],
        semantic_end_token_id=special[SEMANTIC_TEMPLATE.format(sizes["codebook_size"] - 1)],
        text_config=dict(model_type="fish_qwen3", **slow),
        audio_decoder_config=_s2_audio_decoder(sizes, fast_dim),
    )


def _s2_audio_decoder(sizes: dict, fast_dim: int) -> dict:
    return dict(
        model_type="fish_qwen3_audio_decoder",
        vocab_size=sizes["codebook_size"],
        num_codebooks=sizes["num_codebooks"],
        n_layer=sizes["n_fast_layer"],
        dim=fast_dim,
        n_head=sizes["n_head"],
        n_local_heads=sizes["n_local_heads"],
        head_dim=sizes["fast_head_dim"],
        intermediate_size=sizes["intermediate_size"],
        rope_base=1000000.0,
        norm_eps=1e-6,
        max_seq_len=sizes["num_codebooks"] + 1,
        tie_word_embeddings=False,
        attention_qkv_bias=False,
        attention_o_bias=False,
        attention_qk_norm=False,
        text_dim=sizes["dim"],
    )


def randomise_(model: torch.nn.Module, seed: int) -> None:
    """Deterministic init: weights N(0, 0.1/sqrt(fan_in/128)) so big shapes stay well
    scaled; norm weights 1 + 0.1 N(0, 1) (all-ones would hide a forgotten norm scale); biases
    0.02 N(0, 1). Drawn on the model's device (a real-size model on a GPU in a second, not a
    minute of CPU): the same seed gives the same weights on the same kind of device."""
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            normal = torch.randn(p.shape, generator=g, device=p.device)
            if name.endswith("norm.weight"):
                values = 1 + 0.1 * normal
            elif name.endswith(".bias"):
                values = 0.02 * normal
            else:
                fan_in = p.shape[-1]
                values = normal * (0.1 * min(1.0, math.sqrt(128 / fan_in)))
            p.copy_(values.to(torch.bfloat16))  # stored like real checkpoints: bf16 values


def write_weights(out_dir: Path, state_dict: dict, fmt: str, shards: int = 2) -> None:
    """S1: torch.save of a flat state dict to model.pth. S2: S2 key names, safetensors shards
    filled in order up to an even share of the bytes, plus the HF-style index."""
    if fmt == FAMILY_S1:
        torch.save(state_dict, out_dir / PTH_FILE)
        return
    from safetensors.torch import save_file

    named = {s2_stored_name(k): v.contiguous() for k, v in state_dict.items()}
    total = sum(v.numel() * v.element_size() for v in named.values())
    per_shard = math.ceil(total / shards)
    groups, current, size = [], {}, 0
    for k, v in named.items():
        if current and size + v.numel() * v.element_size() > per_shard and len(groups) < shards - 1:
            groups.append(current)
            current, size = {}, 0
        current[k] = v
        size += v.numel() * v.element_size()
    groups.append(current)
    weight_map = {}
    for i, group in enumerate(groups, 1):
        fname = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        save_file(group, str(out_dir / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in group})
    (out_dir / INDEX_FILE).write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n"
    )


def make_tiny(
    out_dir: str | Path, fmt: str = FAMILY_S1, seed: int = 0, max_seq_len: int = 2048, size: str = "tiny", **overrides
) -> Path:
    """Write a deterministic random checkpoint (config, weights, tokenizer) and return its dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sizes = dict(SIZES[size], **{k: v for k, v in overrides.items() if v is not None})
    cfg_json = config_dict(fmt, sizes, max_seq_len)
    config = parse_config(cfg_json, "<make_tiny>")
    special = special_tokens(sizes["codebook_size"])
    config = with_semantic_ids(
        config,
        special[SEMANTIC_TEMPLATE.format(0)],
        special[SEMANTIC_TEMPLATE.format(sizes["codebook_size"] - 1)],
        "<make_tiny>",
    )
    model = build_empty_model(config, torch.device("cpu"), torch.bfloat16)
    randomise_(model, seed)
    (out / "config.json").write_text(json.dumps(cfg_json, indent=2) + "\n")
    write_weights(out, dict(model.state_dict()), fmt)
    write_tokenizer(out, sizes["codebook_size"], tiktoken_files=(fmt == FAMILY_S1))
    return out


def random_model(
    size: str = "tiny",
    seed: int = 0,
    device: str = "auto",
    dtype: str = "auto",
    max_seq_len: int = 4096,
    fmt: str | None = None,
) -> LoadedModel:
    """A random model of a named shape built straight in memory (bench: no multi-GB files), in
    `fmt` (default: the shape's own format, SIZE_FORMATS)."""
    sizes = SIZES[size]
    fmt = fmt or SIZE_FORMATS.get(size, FAMILY_S1)
    config = parse_config(config_dict(fmt, sizes, max_seq_len), f"<random {size}>")
    tok = SyntheticTokenizer(sizes["codebook_size"])
    config = with_semantic_ids(config, tok.semantic_begin_id, tok.semantic_end_id, tok.source)
    dev = resolve_device(device)
    choice = choose_dtype(dtype, dev)
    model = build_empty_model(config, dev, choice.dtype)
    randomise_(model, seed)
    from .checkpoint import LoadReport

    return LoadedModel(
        config=config,
        model=model,
        tokenizer=tok,
        checkpoint_dir=Path(f"random-{size}"),
        device=dev,
        dtype=choice.dtype,
        report=LoadReport(files=[]),
        dtype_reason=choice.reason,
    )
