"""The codec's quantizer: rvq.DownsampleResidualVectorQuantize upstream.

Latents are downsampled 4x by two causal conv + ConvNeXt stages, pass a
window-limited transformer, then a 1-codebook semantic quantizer and a
residual quantizer (9 codebooks in the real codec) on what the semantic one
left. Decoding sums the codebook vectors, runs the post transformer and
upsamples back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..modules import uninitialised_embedding
from .config import CodecConfig
from .layers import (
    PLAIN_WEIGHT,
    WEIGHT_NORM_LEGACY,
    CausalConv1d,
    CausalConvTranspose1d,
    ConvNeXtBlock,
)
from .transformer import WindowLimitedTransformer


class VectorQuantizer(nn.Module):
    """One codebook of descript-audio-codec's VectorQuantize (factorised:
    project to codebook_dim, cosine nearest neighbour, project back)."""

    def __init__(self, input_dim: int, codebook_size: int, codebook_dim: int):
        super().__init__()
        self.in_proj = nn.Conv1d(input_dim, codebook_dim, 1)
        self.out_proj = nn.Conv1d(codebook_dim, input_dim, 1)
        self.in_proj.weight_norm_storage = WEIGHT_NORM_LEGACY
        self.out_proj.weight_norm_storage = WEIGHT_NORM_LEGACY
        self.codebook = uninitialised_embedding(codebook_size, codebook_dim)

    def nearest_codes(self, projected: torch.Tensor) -> torch.Tensor:
        """[B, d, T] projected latents -> [B, T] indices of the closest code by
        cosine (argmax of minus the squared distance of unit vectors)."""
        batch = projected.shape[0]
        flat = F.normalize(projected.transpose(1, 2).reshape(-1, projected.shape[1]))
        book = F.normalize(self.codebook.weight)
        # Same expression as upstream so near-ties resolve the same way.
        distance = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ book.t() + book.pow(2).sum(1, keepdim=True).t()
        return (-distance).max(1)[1].view(batch, -1)

    def quantize(self, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (codes [B, T], reconstruction [B, C, T])."""
        projected = self.in_proj(residual)
        codes = self.nearest_codes(projected)
        chosen = self.code_vectors(codes)
        # Upstream's straight-through estimator evaluates to this sum in eval;
        # keep it rather than `chosen` so rounding matches.
        return codes, self.out_proj(projected + (chosen - projected))

    def code_vectors(self, codes: torch.Tensor) -> torch.Tensor:
        return F.embedding(codes, self.codebook.weight).transpose(1, 2)

    def reconstruct(self, codes: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.code_vectors(codes))


class ResidualVectorQuantizer(nn.Module):
    def __init__(self, input_dim: int, n_codebooks: int, codebook_size: int, codebook_dim: int):
        super().__init__()
        self.codebook_size = codebook_size
        self.quantizers = nn.ModuleList(
            VectorQuantizer(input_dim, codebook_size, codebook_dim) for _ in range(n_codebooks)
        )

    def encode(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (codes [B, n, T], quantized z [B, C, T])."""
        residual = z
        total = None
        codes = []
        for quantizer in self.quantizers:
            codes_i, reconstruction = quantizer.quantize(residual)
            codes.append(codes_i)
            total = reconstruction if total is None else total + reconstruction
            residual = residual - reconstruction
        return torch.stack(codes, dim=1), total

    def from_codes(self, codes: torch.Tensor) -> torch.Tensor:
        total = None
        for index, quantizer in enumerate(self.quantizers):
            part = quantizer.reconstruct(codes[:, index])
            total = part if total is None else total + part
        return total


class DownsampleResidualVectorQuantize(nn.Module):
    def __init__(self, config: CodecConfig):
        super().__init__()
        dims = config.quantizer_dims
        width = dims[-1]
        self.semantic_quantizer = ResidualVectorQuantizer(width, 1, config.semantic_codebook_size, config.codebook_dim)
        self.quantizer = ResidualVectorQuantizer(width, config.n_codebooks, config.codebook_size, config.codebook_dim)
        self.downsample = nn.Sequential(
            *(
                nn.Sequential(
                    CausalConv1d(dims[i], dims[i + 1], factor, stride=factor, weight_norm=PLAIN_WEIGHT),
                    ConvNeXtBlock(dims[i + 1]),
                )
                for i, factor in enumerate(config.downsample_factor)
            )
        )
        # Built deepest stage first, and run in that order (upsample.0 first).
        self.upsample = nn.Sequential(
            *(
                nn.Sequential(
                    CausalConvTranspose1d(dims[i + 1], dims[i], factor, stride=factor, weight_norm=PLAIN_WEIGHT),
                    ConvNeXtBlock(dims[i]),
                )
                for i, factor in reversed(list(enumerate(config.downsample_factor)))
            )
        )
        self.pre_module = nn.Identity() if config.pre_module is None else WindowLimitedTransformer(config.pre_module)
        self.post_module = nn.Identity() if config.post_module is None else WindowLimitedTransformer(config.post_module)

    def encode(self, latent: torch.Tensor) -> torch.Tensor:
        """Encoder latents [B, C, 4F] -> codes [B, 1 + n, F]."""
        z = self.pre_module(self.downsample(latent))
        semantic_codes, semantic_z = self.semantic_quantizer.encode(z)
        residual_codes, _ = self.quantizer.encode(z - semantic_z)
        return torch.cat([semantic_codes, residual_codes], dim=1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """In-range codes [B, 1 + n, F] -> decoder input [B, C, 4F]."""
        z = self.semantic_quantizer.from_codes(codes[:, :1]) + self.quantizer.from_codes(codes[:, 1:])
        return self.upsample(self.post_module(z))
