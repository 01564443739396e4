"""The codec's configuration in upstream's form: the Hydra tree of its constructors (`_target_`
strings and keyword arguments, as in modded_dac_vq.yaml and a checkpoint's config.json), read
as plain data into actors/codec/config.py's dataclasses and written back for the tiny
checkpoints. No `_target_` is ever imported or instantiated."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from .config import CodecConfig, CodecConfigError, TransformerConfig


def from_tree(tree: Mapping[str, Any]) -> CodecConfig:
    """Parse the upstream DAC constructor tree (as in modded_dac_vq.yaml)."""
    if not isinstance(tree, Mapping):
        raise CodecConfigError(f"codec config must be a mapping, got {type(tree).__name__}")
    if tree.get("causal", True) is not True:
        raise CodecConfigError("only the causal codec (causal: true) is supported")
    general = tree.get("transformer_general_config") or {}
    _check_rope(general, "transformer_general_config")
    quantizer = tree.get("quantizer") or {}
    defaults = CodecConfig()
    values: dict[str, Any] = dict(
        sample_rate=int(tree.get("sample_rate", defaults.sample_rate)),
        encoder_dim=int(tree.get("encoder_dim", defaults.encoder_dim)),
        encoder_rates=_int_tuple(tree.get("encoder_rates", defaults.encoder_rates)),
        latent_dim=_optional_int(tree.get("latent_dim")),
        decoder_dim=int(tree.get("decoder_dim", defaults.decoder_dim)),
        decoder_rates=_int_tuple(tree.get("decoder_rates", defaults.decoder_rates)),
        transformer_head_dim=int(general.get("head_dim", defaults.transformer_head_dim)),
        transformer_n_local_heads=int(general.get("n_local_heads", -1)),
        transformer_rope_base=float(general.get("rope_base", defaults.transformer_rope_base)),
        transformer_norm_eps=float(general.get("norm_eps", defaults.transformer_norm_eps)),
    )
    # Upstream's DAC defaults to no transformers when the keys are absent.
    n_stages = len(values["encoder_rates"])
    values["encoder_transformer_layers"] = _int_tuple(tree.get("encoder_transformer_layers", (0,) * n_stages))
    values["decoder_transformer_layers"] = _int_tuple(
        tree.get("decoder_transformer_layers", (0,) * len(values["decoder_rates"]))
    )
    latent = values["latent_dim"] or values["encoder_dim"] * 2**n_stages
    if quantizer:
        input_dim = int(quantizer.get("input_dim", 1024))
        if input_dim != latent:
            raise CodecConfigError(f"quantizer.input_dim {input_dim} != encoder latent width {latent}")
        values.update(
            n_codebooks=int(quantizer.get("n_codebooks", 9)),
            codebook_size=int(quantizer.get("codebook_size", 1024)),
            codebook_dim=int(quantizer.get("codebook_dim", 8)),
            semantic_codebook_size=int(quantizer.get("semantic_codebook_size", 4096)),
            downsample_factor=_int_tuple(quantizer.get("downsample_factor", (2, 2))),
            downsample_dims=(
                None if quantizer.get("downsample_dims") is None else _int_tuple(quantizer["downsample_dims"])
            ),
            pre_module=_parse_window_transformer(quantizer.get("pre_module"), "pre_module"),
            post_module=_parse_window_transformer(quantizer.get("post_module"), "post_module"),
        )
    return CodecConfig(**values).validate()


def read_file(path: str | Path) -> CodecConfig:
    """A config.json holding the tree; a fault names the file."""
    path = Path(path)
    try:
        tree = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CodecConfigError(f"{path}: not valid JSON ({exc})") from exc
    try:
        return from_tree(tree)
    except CodecConfigError as exc:
        raise CodecConfigError(f"{path}: {exc}") from exc


def to_tree(config: CodecConfig) -> dict:
    """The upstream constructor tree; `from_tree(to_tree(config))` round-trips."""
    quantizer: dict[str, Any] = {
        "_target_": "fish_speech.models.dac.rvq.DownsampleResidualVectorQuantize",
        "input_dim": config.latent_width,
        "n_codebooks": config.n_codebooks,
        "codebook_size": config.codebook_size,
        "codebook_dim": config.codebook_dim,
        "quantizer_dropout": 0.5,
        "downsample_factor": list(config.downsample_factor),
    }
    if config.downsample_dims is not None:
        quantizer["downsample_dims"] = list(config.downsample_dims)
    if config.post_module is not None:
        quantizer["post_module"] = transformer_to_tree(config.post_module)
    if config.pre_module is not None:
        quantizer["pre_module"] = transformer_to_tree(config.pre_module)
    quantizer["semantic_codebook_size"] = config.semantic_codebook_size
    tree: dict[str, Any] = {
        "_target_": "fish_speech.models.dac.modded_dac.DAC",
        "sample_rate": config.sample_rate,
        "encoder_dim": config.encoder_dim,
        "encoder_rates": list(config.encoder_rates),
    }
    if config.latent_dim is not None:
        tree["latent_dim"] = config.latent_dim
    tree.update(
        {
            "decoder_dim": config.decoder_dim,
            "decoder_rates": list(config.decoder_rates),
            "encoder_transformer_layers": list(config.encoder_transformer_layers),
            "decoder_transformer_layers": list(config.decoder_transformer_layers),
            "transformer_general_config": {
                "_target_": "fish_speech.models.dac.modded_dac.ModelArgs",
                "_partial_": True,
                "block_size": 8192,
                "n_local_heads": config.transformer_n_local_heads,
                "head_dim": config.transformer_head_dim,
                "rope_base": config.transformer_rope_base,
                "norm_eps": config.transformer_norm_eps,
                "dropout_rate": 0.1,
                "attn_dropout_rate": 0.1,
                "channels_first": True,
            },
            "quantizer": quantizer,
        }
    )
    return tree


def transformer_to_tree(module: TransformerConfig) -> dict:
    """The upstream WindowLimitedTransformer node for this module."""
    return {
        "_target_": "fish_speech.models.dac.modded_dac.WindowLimitedTransformer",
        "causal": True,
        "window_size": module.window_size,
        "input_dim": module.outer_dim,
        "config": {
            "_target_": "fish_speech.models.dac.modded_dac.ModelArgs",
            "block_size": 2048,
            "n_layer": module.n_layer,
            "n_head": module.n_head,
            "dim": module.dim,
            "intermediate_size": module.intermediate_size,
            "n_local_heads": module.n_local_heads,
            "head_dim": module.head_dim,
            "rope_base": module.rope_base,
            "norm_eps": module.norm_eps,
            "dropout_rate": 0.1,
            "attn_dropout_rate": 0.1,
            "channels_first": True,
        },
    }


def _parse_window_transformer(node: Any, where: str) -> Optional[TransformerConfig]:
    if node is None:
        return None
    if not isinstance(node, Mapping):
        raise CodecConfigError(f"quantizer.{where} must be a mapping or null")
    if node.get("causal", True) is not True:
        raise CodecConfigError(f"quantizer.{where}: only causal transformers are supported")
    args = node.get("config") or {}
    _check_rope(args, f"quantizer.{where}.config")
    try:
        dim = int(args["dim"])
        n_head = int(args["n_head"])
        n_layer = int(args["n_layer"])
    except KeyError as exc:
        raise CodecConfigError(f"quantizer.{where}.config lacks {exc.args[0]!r}") from None
    intermediate = args.get("intermediate_size")
    if intermediate is None:
        # ModelArgs.__post_init__: 2/3 of 4*dim rounded up to a multiple of 256.
        hidden = int(2 * 4 * dim / 3)
        intermediate = hidden if hidden % 256 == 0 else hidden + 256 - hidden % 256
    window = node.get("window_size")
    return TransformerConfig(
        n_layer=n_layer,
        n_head=n_head,
        dim=dim,
        intermediate_size=int(intermediate),
        head_dim=int(args.get("head_dim", 64)),
        n_local_heads=int(args.get("n_local_heads", -1)),
        rope_base=float(args.get("rope_base", 10000)),
        norm_eps=float(args.get("norm_eps", 1e-5)),
        window_size=None if window is None else int(window),
        input_dim=int(node.get("input_dim", 512)),
    )


def _check_rope(args: Mapping[str, Any], where: str) -> None:
    kind = args.get("pos_embed_type", "rope")
    if kind != "rope":
        raise CodecConfigError(f"{where}: pos_embed_type {kind!r} is not supported (only 'rope')")


def _int_tuple(values: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _optional_int(value: Any) -> Optional[int]:
    return None if value is None else int(value)
