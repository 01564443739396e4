"""Kernels per decode step, counted through torch's dispatcher: every op a step dispatches that
does device work (a view, a reshape that is a view, an empty allocation or a metadata query
launches nothing; everything else is one launch). On CUDA an op is one kernel launch nearly
always (a matrix product may add a split-K reduction, a sort or top-k a few); the profiler
counts the real launches (figures.launches_per_step). The fused ops count one each, as they
launch one kernel (slot attention: two with more than one key range).

`count_step_kernels` runs one eager decode step of an engine with rows live under the counter.
"""

from __future__ import annotations

from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode

from .slot_attention import splits_for

# The fused decode step's launches, counted here (tiny widths with the shape's layer and codebook
# counts: `counting_model`; slots of 1,024 keys) and documented in docs/engine.md: a test fails
# when the count grows past them. The eager step: S1-mini 2,808, S2-Pro 2,902 on the CPU (its CPU
# attention ops differ from CUDA's; the GPU's profiler counted 3,464-3,877 there).
STEP_KERNEL_BUDGET = {"s1-mini": 699, "s2-pro": 779}

# ops that allocate without writing or only answer about metadata: no launch
_FREE = {
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::lift_fresh", "aten::detach",
    "aten::_local_scalar_dense", "aten::sym_size", "aten::sym_stride", "aten::sym_numel", "aten::is_same_size",
}  # fmt: skip


def _launches(func, args) -> int:
    schema = func._schema
    if schema.name in _FREE:
        return 0
    returns = schema.returns
    if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
        return 0  # a view of an input: no data moves
    if schema.name == "chorus::slot_attention":  # split and merge; one launch for one key range
        return 1 if splits_for(args[1].shape[2]) == 1 else 2
    return 1


class KernelCounter(TorchDispatchMode):
    """Counts the launches of every op dispatched inside it, by op name."""

    def __init__(self):
        super().__init__()
        self.by_op: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        n = _launches(func, args)
        if n:
            self.by_op[func._schema.name] += n
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.by_op.values())


def count_step_kernels(engine) -> dict:
    """The launches of one decode step (its device work: the frame and its bookkeeping) of an
    engine whose rows are live, run eagerly under the counter; by op and in total. The step is
    real: its frame is recorded as any other."""
    runner = engine.runner
    counter = KernelCounter()
    watch, runner.watch_step = runner.watch_step, (lambda: counter)
    graphs, runner.graphs = runner.graphs, None
    frame, runner._frame = runner._frame, runner._decode_frame  # a compiled frame counts as its eager ops
    try:
        engine.step()
    finally:
        runner.watch_step, runner.graphs, runner._frame = watch, graphs, frame
    ops = counter.by_op.most_common()
    return {"kernels": counter.total, "fused": runner.fused, "by_op": dict(ops)}


def counting_model(shape: str, dtype: str = "float32"):
    """A random model with `shape`'s layer counts, codebooks and format at the `tiny` widths: its
    decode step launches as many kernels as the real shape's."""
    from ..tiny import SIZE_FORMATS, SIZES, random_model

    real = SIZES[shape]
    counts = {key: real[key] for key in ("n_layer", "n_fast_layer", "num_codebooks")}
    SIZES.setdefault(f"count-{shape}", dict(SIZES["tiny"], **counts))
    SIZE_FORMATS.setdefault(f"count-{shape}", SIZE_FORMATS.get(shape, "s1"))
    return random_model(f"count-{shape}", device="cpu", dtype=dtype)
