"""Which dtype `auto` means, for the engine and the codec alike, and why (a leaf of actors/:
both import it).

The rule: bfloat16 on CUDA, and on a CPU whose cores multiply bf16 natively -- AVX512-BF16
(`vdpbf16ps`) or AMX-BF16 tiles, as torch's cpuinfo reports them; float32 on every other CPU.
With those units oneDNN runs its bf16 kernels (`brg_matmul:avx512_core_bf16`, or the AMX ones)
on weights it pre-packs for them, and bf16 moves half the bytes: the `small` engine ran
1.4-1.8x float32 on Intel Sapphire Rapids (AMX) and 2.1x at one row, 1.5x at 32 rows on AMD EPYC
Zen 4 (AVX512-BF16), the codec ~1.9x on Sapphire Rapids (docs/architecture.md §6). Without them
(AVX2-only EPYCs) oneDNN refuses to pre-pack bf16 weights and torch converts per product:
bf16 ran 0.2x float32 at 32 rows.

`CpuUnits` is what the rule reads; tests hand it in instead of the machine's."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import torch

from actors.dtype_names import AUTO, DTYPE_NAMES

log = logging.getLogger(f"chorus.{__name__}")  # one namespace: configuring "chorus" reaches every module

DTYPES = {name: getattr(torch, attribute) for name, attribute in DTYPE_NAMES.items()}


@dataclass(frozen=True)
class CpuUnits:
    """The CPU's native bf16 matrix units (torch's cpuinfo, the detection oneDNN dispatches on)."""

    amx_bf16: bool
    avx512_bf16: bool

    @classmethod
    def of_this_cpu(cls) -> CpuUnits:
        cpu = torch.cpu

        def has(probe: str) -> bool:
            return bool(getattr(cpu, probe, lambda: False)())

        return cls(amx_bf16=has("_is_amx_tile_supported"), avx512_bf16=has("_is_avx512_bf16_supported"))

    def bf16_unit(self) -> Optional[str]:
        """The unit bf16 products run on here, by its /proc/cpuinfo flag name; None if neither."""
        if self.amx_bf16:
            return "amx_bf16"
        return "avx512_bf16" if self.avx512_bf16 else None


@dataclass(frozen=True)
class DtypeChoice:
    dtype: torch.dtype
    reason: str  # why: "requested", or the rule's ground for `auto`

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def describe(self) -> str:
        return self.name if self.reason == "requested" else f"{self.name} (auto: {self.reason})"


def auto_dtype(device: str | torch.device | None = None, units: Optional[CpuUnits] = None) -> DtypeChoice:
    """The rule above for `device` (None = the CPU); `units` defaults to this machine's."""
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda":
        return DtypeChoice(torch.bfloat16, "cuda")
    if device.type != "cpu":
        return DtypeChoice(torch.float32, f"{device.type}: no bf16 rule, float32")
    unit = (units or CpuUnits.of_this_cpu()).bf16_unit()
    if unit:
        return DtypeChoice(torch.bfloat16, f"cpu has {unit}")
    return DtypeChoice(torch.float32, "cpu has neither avx512_bf16 nor amx_bf16: bf16 products would be slower")


_logged: set[str] = set()


def choose_dtype(
    dtype: str | torch.dtype = AUTO, device: str | torch.device | None = None, units: Optional[CpuUnits] = None
) -> DtypeChoice:
    """A dtype name, `auto`, or a torch dtype -> the dtype and why. `auto`'s choice is logged
    once per process and reason (`dtype auto -> bfloat16 (cpu has avx512_bf16)`)."""
    if isinstance(dtype, torch.dtype):
        return DtypeChoice(dtype, "requested")
    if dtype == AUTO:
        choice = auto_dtype(device, units)
        message = f"dtype auto -> {choice.name} ({choice.reason})"
        if message not in _logged:
            _logged.add(message)
            log.info(message)
        return choice
    try:
        return DtypeChoice(DTYPES[dtype], "requested")
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)} or 'auto'") from None


def check_model_dtype(device: str | torch.device) -> torch.dtype:
    """The dtype the quality checks' models (ASR, speaker) run in: float16 on CUDA (the tensor
    cores' rate, half the memory; what comes out is read in float32), float32 elsewhere."""
    return torch.float16 if torch.device(device).type == "cuda" else torch.float32
