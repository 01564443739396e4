"""The engine's fused kernels, each beside its eager reference (docs/engine.md, "Fused kernels").

    norm.py            residual add + RMSNorm in upstream's cast order
    rope.py            q/k-norm + RoPE + the K/V write of an attention layer
    slot_attention.py  attention over each token's own slot keys (split-K; no mask, no key bucket)
    swiglu.py          SwiGLU's silu(a) * b
    sampler.py         one draw per launch: the main token (penalty, RAS) or one codebook
    stack.py           the fused forward of a stack of blocks, built from the above (or from
                       the references compiled by inductor: engine.kernels=compiled)
    fp8.py             FP8 storage of K/V and weights (options, never the default)
    counting.py        kernels per decode step, counted through torch's dispatcher
    triton_shim.py     Triton where installed (CUDA torch); its interpreter on CPU for tests

Each kernel is a custom op (`torch.ops.chorus.*`): on CUDA its Triton kernel, on the CPU its eager
reference (or the Triton kernel in Triton's interpreter under TRITON_INTERPRET=1), so one call site
serves every device and a step's op count is its launch count. `engine.kernels` chooses the
path (`kernel_path`); the eager path (the model's own modules) stays the CPU's.
"""

from __future__ import annotations

from ..settings import kernel_mode


def kernel_path(mode: str, device_type: str) -> str:
    """What an engine with engine.kernels=`mode` on `device_type` runs: "eager" (the model's
    modules), "fused" (this package's ops) or "compiled" (their references through inductor);
    auto is fused on CUDA where Triton is installed, else eager."""
    mode = kernel_mode(mode)
    if mode == "auto":
        from .triton_shim import HAVE_TRITON

        return "fused" if device_type == "cuda" and HAVE_TRITON else "eager"
    return mode
