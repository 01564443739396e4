"""Causal modded-DAC codec of OpenAudio S1 / S2-Pro: audio <-> 10 code rows.

    from actors.codec import load_codec
    codec = load_codec("checkpoints/codec.pth")
    codes = codec.encode_batch([wave])      # [10, frames] int64 per row
    waves = codec.decode_batch(codes)       # float32, frames * 2048 samples

Only torch, numpy and the standard library are imported here. A layer of actors/ (its
__init__ draws them): it imports the leaves (actors/*.py, actors/storage/) only, never the
engine, quality/ or synth/.
"""

from .config import CodecConfig, CodecConfigError, TransformerConfig
from .loader import CodecCheckpointError, codec_from_state_dict, load_codec
from .model import Codec

__all__ = [
    "Codec",
    "CodecCheckpointError",
    "CodecConfig",
    "CodecConfigError",
    "TransformerConfig",
    "codec_from_state_dict",
    "load_codec",
]
