"""Typed configuration of the causal modded-DAC codec.

Upstream describes the codec with a Hydra tree (``_target_`` strings and
constructor keyword arguments, see ``modded_dac_vq.yaml``). We read that tree
as plain data into frozen dataclasses; no ``_target_`` is ever imported or
instantiated: actors/codec/hydra_tree.py reads and writes that tree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

CONFIG_FILE_NAME = "config.json"

# Upstream multiplies the hop length by 4 (the quantizer's two 2x downsamples)
# with a literal, not with prod(downsample_factor); we derive it but check it.
_UPSTREAM_FRAME_MULTIPLIER = 4

# Upstream's EncoderBlock hard-codes these for its transformer: the window
# (a getattr on functools.partial that always falls back to 512), heads of 64
# channels and a 3x feed-forward width.
ENCODER_TRANSFORMER_WINDOW = 512
ENCODER_TRANSFORMER_HEAD_WIDTH = 64
ENCODER_TRANSFORMER_FFN_MULTIPLIER = 3


class CodecConfigError(ValueError):
    """The codec configuration cannot describe a model we can build."""


@dataclass(frozen=True)
class TransformerConfig:
    """One WindowLimitedTransformer (RoPE, RMSNorm, SwiGLU, LayerScale)."""

    n_layer: int
    n_head: int
    dim: int
    intermediate_size: int
    head_dim: int
    n_local_heads: int = -1
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    # None means plain causal attention; otherwise query i sees keys
    # i - window_size + 1 .. i.
    window_size: Optional[int] = None
    # Width of the tensor handed to the module; a Linear projects it to `dim`
    # when the two differ (input_proj / output_proj upstream).
    input_dim: Optional[int] = None

    @property
    def kv_heads(self) -> int:
        return self.n_head if self.n_local_heads in (-1, None) else self.n_local_heads

    @property
    def outer_dim(self) -> int:
        return self.dim if self.input_dim is None else self.input_dim

    def validate(self, where: str) -> None:
        if self.n_layer < 0 or self.n_head <= 0 or self.head_dim <= 0 or self.dim <= 0:
            raise CodecConfigError(f"{where}: layer/head sizes must be positive, got {self}")
        if self.head_dim % 2:
            raise CodecConfigError(f"{where}: RoPE needs an even head_dim, got {self.head_dim}")
        if self.n_head % self.kv_heads:
            raise CodecConfigError(f"{where}: n_head {self.n_head} is not a multiple of n_local_heads {self.kv_heads}")
        if self.window_size is not None and self.window_size < 1:
            raise CodecConfigError(f"{where}: window_size must be >= 1, got {self.window_size}")


@dataclass(frozen=True)
class CodecConfig:
    """Architecture of the codec. Defaults are the real S1 / S2-Pro codec."""

    sample_rate: int = 44100
    encoder_dim: int = 64
    encoder_rates: tuple[int, ...] = (2, 4, 8, 8)
    latent_dim: Optional[int] = None
    decoder_dim: int = 1536
    decoder_rates: tuple[int, ...] = (8, 8, 4, 2)
    encoder_transformer_layers: tuple[int, ...] = (0, 0, 0, 4)
    # Kept only to round-trip configs: upstream builds a decoder transformer
    # but leaves it out of the forward pass, so it has no weights.
    decoder_transformer_layers: tuple[int, ...] = (4, 0, 0, 0)
    # transformer_general_config (the ModelArgs partial shared by the encoder
    # transformers)
    transformer_head_dim: int = 64
    transformer_n_local_heads: int = -1
    transformer_rope_base: float = 10000.0
    transformer_norm_eps: float = 1e-5
    # quantizer (rvq.DownsampleResidualVectorQuantize)
    n_codebooks: int = 9
    codebook_size: int = 1024
    codebook_dim: int = 8
    semantic_codebook_size: int = 4096
    downsample_factor: tuple[int, ...] = (2, 2)
    downsample_dims: Optional[tuple[int, ...]] = None
    pre_module: Optional[TransformerConfig] = field(default_factory=lambda: _real_quantizer_transformer())
    post_module: Optional[TransformerConfig] = field(default_factory=lambda: _real_quantizer_transformer())

    # ---- derived sizes -------------------------------------------------
    @property
    def latent_width(self) -> int:
        if self.latent_dim is not None:
            return self.latent_dim
        return self.encoder_dim * 2 ** len(self.encoder_rates)

    @property
    def hop_length(self) -> int:
        return math.prod(self.encoder_rates)

    @property
    def frame_length(self) -> int:
        return self.hop_length * math.prod(self.downsample_factor)

    @property
    def num_codebooks(self) -> int:
        return 1 + self.n_codebooks

    @property
    def codebook_sizes(self) -> list[int]:
        return [self.semantic_codebook_size] + [self.codebook_size] * self.n_codebooks

    @property
    def quantizer_dims(self) -> tuple[int, ...]:
        """Channel widths through the quantizer's down-sampling stack."""
        inner = self.downsample_dims or tuple(self.latent_width for _ in self.downsample_factor)
        return (self.latent_width,) + tuple(inner)

    def encoder_transformer(self, stage: int) -> Optional[TransformerConfig]:
        """The transformer closing encoder stage `stage` (0-based), if any."""
        n_layer = self.encoder_transformer_layers[stage]
        if n_layer == 0:
            return None
        width = self.encoder_dim * 2 ** (stage + 1)
        return TransformerConfig(
            n_layer=n_layer,
            n_head=width // ENCODER_TRANSFORMER_HEAD_WIDTH,
            dim=width,
            intermediate_size=width * ENCODER_TRANSFORMER_FFN_MULTIPLIER,
            head_dim=self.transformer_head_dim,
            n_local_heads=self.transformer_n_local_heads,
            rope_base=self.transformer_rope_base,
            norm_eps=self.transformer_norm_eps,
            window_size=ENCODER_TRANSFORMER_WINDOW,
        )

    def validate(self) -> CodecConfig:
        if len(self.encoder_rates) != len(self.encoder_transformer_layers):
            raise CodecConfigError(
                "encoder_rates and encoder_transformer_layers must have the same length, got "
                f"{list(self.encoder_rates)} and {list(self.encoder_transformer_layers)}"
            )
        if math.prod(self.encoder_rates) != math.prod(self.decoder_rates):
            raise CodecConfigError(
                f"encoder_rates {list(self.encoder_rates)} and decoder_rates "
                f"{list(self.decoder_rates)} must have the same product (hop length)"
            )
        if math.prod(self.downsample_factor) != _UPSTREAM_FRAME_MULTIPLIER:
            raise CodecConfigError(
                "upstream fixes frame_length = hop_length * 4; downsample_factor "
                f"{list(self.downsample_factor)} has product {math.prod(self.downsample_factor)}"
            )
        if self.downsample_dims is not None and len(self.downsample_dims) != len(self.downsample_factor):
            raise CodecConfigError("downsample_dims must have one entry per downsample_factor")
        if self.decoder_dim % 2 ** len(self.decoder_rates):
            raise CodecConfigError(f"decoder_dim {self.decoder_dim} must be divisible by 2**{len(self.decoder_rates)}")
        for stage in range(len(self.encoder_rates)):
            block = self.encoder_transformer(stage)
            if block is not None:
                if block.n_head == 0:
                    raise CodecConfigError(f"encoder stage {stage} has width {block.dim} < 64: no room for a head")
                block.validate(f"encoder transformer {stage}")
        bottleneck = self.quantizer_dims[-1]
        for name, module in (("pre_module", self.pre_module), ("post_module", self.post_module)):
            if module is not None:
                module.validate(name)
                if module.outer_dim != bottleneck:
                    raise CodecConfigError(
                        f"quantizer {name} input_dim {module.outer_dim} != quantizer width {bottleneck}"
                    )
        if min(self.codebook_sizes) < 1 or self.codebook_dim < 1:
            raise CodecConfigError("codebook sizes and codebook_dim must be positive")
        return self

    @classmethod
    def real(cls) -> CodecConfig:
        """The codec shipped with OpenAudio S1 and S2-Pro (modded_dac_vq.yaml)."""
        return cls().validate()

    @classmethod
    def tiny(cls, semantic_codebook_size: int = 256, codebook_size: int = 128) -> CodecConfig:
        """Same module types as the real codec at test-vector size (codec-tiny)."""
        quantizer_transformer = TransformerConfig(
            n_layer=2,
            n_head=4,
            dim=64,
            intermediate_size=192,
            head_dim=16,
            window_size=8,
            input_dim=64,
        )
        return cls(
            encoder_dim=4,
            decoder_dim=64,
            encoder_transformer_layers=(0, 0, 0, 1),
            semantic_codebook_size=semantic_codebook_size,
            codebook_size=codebook_size,
            pre_module=quantizer_transformer,
            post_module=quantizer_transformer,
        ).validate()

    def with_codebook_sizes(self, semantic: int, residual: int) -> CodecConfig:
        return replace(self, semantic_codebook_size=semantic, codebook_size=residual).validate()


def _real_quantizer_transformer() -> TransformerConfig:
    return TransformerConfig(
        n_layer=8,
        n_head=16,
        dim=1024,
        intermediate_size=3072,
        head_dim=64,
        window_size=128,
        input_dim=1024,
    )
