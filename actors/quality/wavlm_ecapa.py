"""Speaker embeddings as Seed-TTS-eval measures speaker similarity (SIM): UniSpeech's WavLM-Large
fine-tuned for speaker verification, an ECAPA-TDNN head over a learned mix of WavLM's hidden
states (microsoft/UniSpeech, downstreams/speaker_verification; the checkpoint
`wavlm_large_finetune.pth` that BytedanceSpeech/seed-tts-eval's README links), loaded from a
local directory (`quality.speaker=wavlm_ecapa quality.speaker_model=DIR`).

The published file is `torch.save({"model": state_dict})` of UniSpeech's `ECAPA_TDNN_SMALL(
feat_dim=1024, feat_type="wavlm_large")`: the WavLM backbone under `feature_extract.model.`
(s3prl's WavLM, original fairseq-style names), `feature_weight` (one weight per hidden state) and
the ECAPA-TDNN head (`layer1`..`layer4`, `conv`, `pooling`, `bn`, `linear`). What it computes, as
upstream's `verification.py` does for one clip at 16 kHz:

    wave -> layer_norm over the whole clip (WavLM-Large's `normalize`)
         -> WavLM -> hidden states: the input of each transformer layer and the encoder's
            output after its final layer norm (s3prl's hooks: 25 for Large)
         -> sum weighted by softmax(feature_weight) -> (C, T) + 1e-6 -> instance norm over T
         -> ECAPA-TDNN (conv -> ReLU -> batch norm blocks, Res2 dilated blocks with
            squeeze-excitation, attentive statistics pooling) -> a 256-d embedding

The backbone runs as transformers' `WavLMModel` with the checkpoint's weights renamed to its
names (its hidden states are the same 25: each layer's input and the final normed output); its
sizes (layers, width, heads, buckets, conv stack, positional conv) are read from the tensors'
shapes, and what shapes cannot tell is WavLM-Large's (stable layer norm, layer-normed conv
stack, max relative distance 800, wave normalisation). The head is this module's own, its
parameter names the published file's. A checkpoint whose file lacks the backbone (upstream loads
it non-strictly over s3prl's WavLM-Large) takes it from s3prl's `wavlm_large.pt` or Microsoft's
`WavLM-Large.pt` in the same directory.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from actors.audio import resample
from actors.errors import ConfigError
from actors.quality.settings import WAVLM_ECAPA_FILE

CHECKPOINT = WAVLM_ECAPA_FILE
BACKBONE_FILES = ("wavlm_large.pt", "WavLM-Large.pt")
BACKBONE_PREFIX = "feature_extract.model."
SAMPLE_RATE = 16000
DOWNLOAD_HINT = (
    "download wavlm_large_finetune.pth from the link in BytedanceSpeech/seed-tts-eval's README "
    "(UniSpeech's WavLM-Large speaker-verification checkpoint) into that directory"
)
# WavLM-Large's facts the tensors' shapes cannot tell
CONV_STRIDES = (5, 2, 2, 2, 2, 2, 2)
MAX_RELATIVE_DISTANCE = 800
RES2_DILATIONS = (2, 3, 4)  # layer2..layer4: kernel 3, padding = dilation
MIN_FRAMES = 2  # one frame has no spread over time: instance norm makes it all zeros


# ---- the ECAPA-TDNN head (parameter names: the published checkpoint's) ------------------------


class ConvReluBn(nn.Module):
    def __init__(self, channels_in: int, channels_out: int, kernel: int = 1, padding: int = 0, dilation: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(channels_in, channels_out, kernel, padding=padding, dilation=dilation)
        self.bn = nn.BatchNorm1d(channels_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(F.relu(self.conv(x)))


class Res2ConvReluBn(nn.Module):
    """The channels cut into `scale` groups; each but the last convolved after adding the
    previous group's output (a growing receptive field), the last passed through."""

    def __init__(self, channels: int, scale: int, dilation: int):
        super().__init__()
        self.width = channels // scale
        self.convs = nn.ModuleList(
            nn.Conv1d(self.width, self.width, 3, padding=dilation, dilation=dilation) for _ in range(scale - 1)
        )
        self.bns = nn.ModuleList(nn.BatchNorm1d(self.width) for _ in range(scale - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = torch.split(x, self.width, dim=1)
        out, running = [], None
        for i, (conv, bn) in enumerate(zip(self.convs, self.bns)):
            running = groups[i] if i == 0 else running + groups[i]
            running = bn(F.relu(conv(running)))
            out.append(running)
        out.append(groups[len(self.convs)])
        return torch.cat(out, dim=1)


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, bottleneck: int):
        super().__init__()
        self.linear1 = nn.Linear(channels, bottleneck)
        self.linear2 = nn.Linear(bottleneck, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.linear2(F.relu(self.linear1(x.mean(dim=2)))))
        return x * gate.unsqueeze(2)


class SERes2Block(nn.Module):
    def __init__(self, channels: int, scale: int, dilation: int, bottleneck: int):
        super().__init__()
        self.Conv1dReluBn1 = ConvReluBn(channels, channels)
        self.Res2Conv1dReluBn = Res2ConvReluBn(channels, scale, dilation)
        self.Conv1dReluBn2 = ConvReluBn(channels, channels)
        self.SE_Connect = SqueezeExcite(channels, bottleneck)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.SE_Connect(self.Conv1dReluBn2(self.Res2Conv1dReluBn(self.Conv1dReluBn1(x))))


class AttentiveStatsPool(nn.Module):
    """Each channel's mean and standard deviation over time, weighted by a learned attention."""

    def __init__(self, channels: int, attention: int):
        super().__init__()
        self.linear1 = nn.Conv1d(channels, attention, kernel_size=1)
        self.linear2 = nn.Conv1d(attention, channels, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = torch.softmax(self.linear2(torch.tanh(self.linear1(x))), dim=2)
        mean = torch.sum(alpha * x, dim=2)
        variance = torch.sum(alpha * x**2, dim=2) - mean**2
        return torch.cat([mean, torch.sqrt(variance.clamp(min=1e-9))], dim=1)


class EcapaHead(nn.Module):
    def __init__(self, sizes: dict):
        super().__init__()
        channels, wide = sizes["channels"], sizes["wide"]
        self.feature_weight = nn.Parameter(torch.zeros(sizes["states"]))
        self.instance_norm = nn.InstanceNorm1d(sizes["features"])
        self.layer1 = ConvReluBn(sizes["features"], channels, kernel=5, padding=2)
        for name, dilation in zip(("layer2", "layer3", "layer4"), RES2_DILATIONS):
            setattr(self, name, SERes2Block(channels, sizes["scale"], dilation, sizes["bottleneck"]))
        self.conv = nn.Conv1d(channels * 3, wide, kernel_size=1)
        self.pooling = AttentiveStatsPool(wide, sizes["attention"])
        self.bn = nn.BatchNorm1d(wide * 2)
        self.linear = nn.Linear(wide * 2, sizes["embedding"])

    def forward(self, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
        """hidden_states: (B, T, C) each -> (B, embedding)."""
        mix = torch.softmax(self.feature_weight, dim=-1).view(-1, 1, 1, 1)
        x = (mix * torch.stack(list(hidden_states), dim=0)).sum(dim=0)
        x = self.instance_norm(x.transpose(1, 2) + 1e-6)
        out1 = self.layer1(x)
        out2 = self.layer2(out1)
        out3 = self.layer3(out2)
        out4 = self.layer4(out3)
        out = F.relu(self.conv(torch.cat([out2, out3, out4], dim=1)))
        return self.linear(self.bn(self.pooling(out)))


def head_sizes(state: dict) -> dict:
    """The head's sizes, from its tensors' shapes."""
    return {
        "states": state["feature_weight"].shape[0],
        "features": state["layer1.conv.weight"].shape[1],
        "channels": state["layer1.conv.weight"].shape[0],
        "scale": 1 + len({k.split(".")[3] for k in state if k.startswith("layer2.Res2Conv1dReluBn.convs.")}),
        "bottleneck": state["layer2.SE_Connect.linear1.weight"].shape[0],
        "wide": state["conv.weight"].shape[0],
        "attention": state["pooling.linear1.weight"].shape[0],
        "embedding": state["linear.weight"].shape[0],
    }


# ---- the WavLM backbone: the published names -> transformers' ---------------------------------

_RENAMES = (
    (r"feature_extractor\.conv_layers\.(\d+)\.0\.weight", r"feature_extractor.conv_layers.\1.conv.weight"),
    (r"feature_extractor\.conv_layers\.(\d+)\.2\.1\.(weight|bias)", r"feature_extractor.conv_layers.\1.layer_norm.\2"),
    (r"layer_norm\.(weight|bias)", r"feature_projection.layer_norm.\1"),
    (r"post_extract_proj\.(weight|bias)", r"feature_projection.projection.\1"),
    (r"encoder\.pos_conv\.0\.weight_g", "encoder.pos_conv_embed.conv.parametrizations.weight.original0"),
    (r"encoder\.pos_conv\.0\.weight_v", "encoder.pos_conv_embed.conv.parametrizations.weight.original1"),
    (r"encoder\.pos_conv\.0\.bias", "encoder.pos_conv_embed.conv.bias"),
    (
        r"encoder\.layers\.(\d+)\.self_attn\.relative_attention_bias\.weight",
        r"encoder.layers.\1.attention.rel_attn_embed.weight",
    ),
    (
        r"encoder\.layers\.(\d+)\.self_attn\.grep_linear\.(weight|bias)",
        r"encoder.layers.\1.attention.gru_rel_pos_linear.\2",
    ),
    (r"encoder\.layers\.(\d+)\.self_attn\.grep_a", r"encoder.layers.\1.attention.gru_rel_pos_const"),
    (r"encoder\.layers\.(\d+)\.self_attn\.(q|k|v|out)_proj\.(weight|bias)", r"encoder.layers.\1.attention.\2_proj.\3"),
    (r"encoder\.layers\.(\d+)\.self_attn_layer_norm\.(weight|bias)", r"encoder.layers.\1.layer_norm.\2"),
    (r"encoder\.layers\.(\d+)\.fc1\.(weight|bias)", r"encoder.layers.\1.feed_forward.intermediate_dense.\2"),
    (r"encoder\.layers\.(\d+)\.fc2\.(weight|bias)", r"encoder.layers.\1.feed_forward.output_dense.\2"),
    (r"encoder\.layers\.(\d+)\.final_layer_norm\.(weight|bias)", r"encoder.layers.\1.final_layer_norm.\2"),
    (r"encoder\.layer_norm\.(weight|bias)", r"encoder.layer_norm.\1"),
)
# pre-training parts the speaker model never runs
_UNUSED = re.compile(r"mask_emb|label_embs_concat|final_proj\..*|project_q\..*|quantizer\..*")


def transformers_names(backbone: dict) -> dict:
    """The backbone's tensors under transformers' WavLMModel names; an unknown name is an error
    (a checkpoint of another architecture), the pre-training heads are dropped."""
    out = {}
    for name, tensor in backbone.items():
        if _UNUSED.fullmatch(name):
            continue
        for pattern, target in _RENAMES:
            if re.fullmatch(pattern, name):
                out[re.sub(pattern, target, name)] = tensor
                break
        else:
            raise ValueError(f"{BACKBONE_PREFIX}{name} is not a WavLM tensor this loader knows")
    return out


def backbone_config(state: dict):
    """A WavLMConfig of the backbone's sizes (from its tensors' shapes) and WavLM-Large's rest."""
    from transformers import WavLMConfig

    layers = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("encoder.layers."))
    convs = sorted(
        int(k.split(".")[2]) for k in state if re.fullmatch(r"feature_extractor\.conv_layers\.\d+\.0\.weight", k)
    )
    conv = [state[f"feature_extractor.conv_layers.{i}.0.weight"] for i in convs]
    hidden, pos = state["post_extract_proj.weight"].shape[0], state["encoder.pos_conv.0.weight_v"]
    buckets, heads = state["encoder.layers.0.self_attn.relative_attention_bias.weight"].shape
    return WavLMConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=state["encoder.layers.0.fc1.weight"].shape[0],
        conv_dim=tuple(w.shape[0] for w in conv),
        conv_kernel=tuple(w.shape[2] for w in conv),
        conv_stride=CONV_STRIDES[: len(conv)],
        conv_bias=f"feature_extractor.conv_layers.{convs[0]}.0.bias" in state,
        feat_extract_norm="layer",
        do_stable_layer_norm=True,
        num_conv_pos_embeddings=pos.shape[2],
        num_conv_pos_embedding_groups=hidden // pos.shape[1],
        num_buckets=buckets,
        max_bucket_distance=MAX_RELATIVE_DISTANCE,
        layer_norm_eps=1e-5,
    )


def split_checkpoint(state: dict, model_dir: Path) -> tuple[dict, dict]:
    """(backbone tensors under the original WavLM names, head tensors)."""
    head = {k: v for k, v in state.items() if not k.startswith("feature_extract.")}
    backbone = {k[len(BACKBONE_PREFIX) :]: v for k, v in state.items() if k.startswith(BACKBONE_PREFIX)}
    if not backbone:
        found = [model_dir / name for name in BACKBONE_FILES if (model_dir / name).is_file()]
        if not found:
            raise ConfigError(
                f"quality.speaker_model: {model_dir / CHECKPOINT} holds no WavLM backbone and the directory has "
                f"none of {', '.join(BACKBONE_FILES)} (s3prl's or Microsoft's WavLM-Large): add one"
            )
        backbone = _read_state(found[0])
    return backbone, head


def _read_state(path: Path) -> dict:
    """The tensors of a checkpoint (`{"model": state_dict}`), read without running pickled code."""
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # a pickle of other objects, a torn download
        raise ConfigError(
            f"quality.speaker_model: {path} cannot be read as tensors ({type(e).__name__}: {e}); "
            "if it holds other pickled objects, save just its state dict: "
            "torch.save({'model': torch.load(path, weights_only=False)['model']}, path)"
        ) from None
    state = loaded.get("model", loaded) if isinstance(loaded, dict) else None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"quality.speaker_model: {path} is not a state dict (expected {{'model': {{name: tensor}}}})")
    return state


class WavLMEcapaEmbedder:
    """The published checkpoint on one device, giving unit-norm speaker embeddings, one clip per
    forward pass (no padding: a clip's embedding never depends on its batch-mates)."""

    def __init__(self, model_dir: str, device: str = "cpu"):
        root = Path(model_dir)
        path = root / CHECKPOINT if root.is_dir() else root
        if not path.is_file():
            raise ConfigError(f"quality.speaker_model: {path} not found; {DOWNLOAD_HINT}")
        from transformers import WavLMModel

        backbone, head = split_checkpoint(_read_state(path), path.parent)
        try:
            self.backbone = WavLMModel(backbone_config(backbone))
            missing = self._load(self.backbone, transformers_names(backbone), "masked_spec_embed")
            self.head = EcapaHead(head_sizes(head))
            missing += self._load(self.head, head)
        except (KeyError, ValueError, RuntimeError) as e:
            raise ConfigError(
                f"quality.speaker_model: {path} is not UniSpeech's WavLM ECAPA-TDNN checkpoint ({e})"
            ) from None
        if missing:
            raise ConfigError(f"quality.speaker_model: {path} lacks {', '.join(missing[:5])}")
        # s3prl's hidden states, taken as s3prl takes them (not transformers' `hidden_states`,
        # whose last entry has changed meaning between its releases): each transformer layer's
        # input, then the model's output
        self._inputs: list = []
        for layer in self.backbone.encoder.layers:
            layer.register_forward_pre_hook(lambda module, args: self._inputs.append(args[0]))
        # float32 everywhere: the head's batch norms and the pooling's variance are not
        # half-precision safe, and the model is small next to the TTS one
        self.device = device
        self.backbone.to(device).eval()
        self.head.to(device).eval()
        self.dim = self.head.linear.out_features
        self.sample_rate = SAMPLE_RATE
        self.min_samples = (
            (MIN_FRAMES - 1) * math.prod(self.backbone.config.conv_stride)
            + sum(
                (k - 1) * math.prod(self.backbone.config.conv_stride[:i])
                for i, k in enumerate(self.backbone.config.conv_kernel)
            )
            + 1
        )

    @staticmethod
    def _load(module: nn.Module, state: dict, *optional: str) -> list:
        """Load `state` strictly but for `optional` and batch norms' step counters; the names missing."""
        result = module.load_state_dict(state, strict=False)
        if result.unexpected_keys:
            raise ValueError(f"unexpected tensors {result.unexpected_keys[:5]}")
        return [k for k in result.missing_keys if k not in optional and not k.endswith("num_batches_tracked")]

    def embed(self, clips: Sequence[np.ndarray], sample_rate: int) -> np.ndarray:
        """(len(clips), dim) float32 unit-norm embeddings of float32 mono clips; a clip too short to
        embed gets a row of NaN."""
        out = np.full((len(clips), self.dim), np.nan, dtype=np.float32)
        for row, clip in enumerate(clips):
            wave = resample(np.asarray(clip, dtype=np.float32), sample_rate, self.sample_rate)
            if len(wave) >= self.min_samples:
                out[row] = self.embed_wave(wave)
        return out

    def hidden_states(self, wave: torch.Tensor) -> list:
        """s3prl's hidden states of a (1, samples) wave at 16 kHz, normalised as WavLM-Large's is."""
        self._inputs.clear()
        output = self.backbone(F.layer_norm(wave, wave.shape[-1:])).last_hidden_state
        states = [*self._inputs, output]
        self._inputs.clear()
        return states

    def embed_wave(self, wave: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            x = torch.from_numpy(np.ascontiguousarray(wave, dtype=np.float32)).to(self.device)[None]
            embedding = self.head(self.hidden_states(x))[0].double().cpu().numpy()
        norm = float(np.linalg.norm(embedding))
        if not (math.isfinite(norm) and norm > 0):
            return np.full(self.dim, np.nan, dtype=np.float32)
        return (embedding / norm).astype(np.float32)
