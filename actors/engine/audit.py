"""Whether a decode step can be captured as a CUDA graph, checked on any device (the CPU too).

A captured graph replays the kernels it recorded on the addresses it recorded. So the step may
read and write, of what it did not make itself, only tensors that live as long as the engine
(the runner registers them: `ModelRunner.static_tensors`); it may not ask the host for a value
(`.item()`, `nonzero`, a copy to the CPU: a capture refuses them, and a replay would not redo
them); and nothing it makes may outlive it (a table rebuilt and kept would be a fresh address
the graph never sees). `StepAudit` watches every op of a step through torch's dispatcher and
records each of these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# ops that hand a tensor's value to the host (a sync on a GPU; refused inside a capture)
HOST_READS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.nonzero.default,
    torch.ops.aten.equal.default,
    torch.ops.aten.is_nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten.unique_consecutive.default,
    torch.ops.aten._unique2.default,
}


# ops that copy between devices (a copy to the CPU waits for the device; other ops may return
# small CPU tensors without a wait, e.g. the attention kernels' random-number seeds)
COPIES = {
    torch.ops.aten._to_copy.default,
    torch.ops.aten.copy_.default,
    torch.ops.aten._copy_from.default,
    torch.ops.aten._copy_from_and_resize.default,
}


def _storage_key(t: torch.Tensor):
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # opaque tensors (e.g. oneDNN-packed weights)
        return None


@dataclass
class AuditReport:
    host_reads: list[str] = field(default_factory=list)  # ops that read a value back
    to_host: list[str] = field(default_factory=list)  # copies off the device
    foreign_reads: int = 0  # outside tensors read that are not registered as static
    foreign_writes: int = 0  # outside tensors written that are not registered as mutable
    foreign_examples: list[str] = field(default_factory=list)
    outside_read: int = 0  # registered tensors the step read

    @property
    def capturable(self) -> bool:
        return not (self.host_reads or self.to_host or self.foreign_reads or self.foreign_writes)

    def as_dict(self) -> dict:
        return {
            "capturable": self.capturable,
            "host_reads": self.host_reads,
            "to_host": self.to_host,
            "foreign_reads": self.foreign_reads,
            "foreign_writes": self.foreign_writes,
            "foreign_examples": self.foreign_examples[:5],
            "static_tensors_read": self.outside_read,
        }


class StepAudit(TorchDispatchMode):
    """Records a step's ops against the tensors registered as static (`readable`: may be read;
    `writable`: may also be written). Use as a context manager around one step."""

    def __init__(self, readable: list[torch.Tensor], writable: list[torch.Tensor]):
        super().__init__()
        self.readable = {k for k in map(_storage_key, readable) if k is not None}
        self.writable = {k for k in map(_storage_key, writable) if k is not None}
        self.readable |= self.writable
        self.made: set = set()
        self.seen_static: set = set()
        self.report = AuditReport()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = str(func)
        if func in HOST_READS:
            self.report.host_reads.append(name)
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        written = self._written_arguments(func, args, kwargs)
        for t in inputs:
            self._check(t, name, any(t is w for w in written))
        out = func(*args, **kwargs)
        if func in COPIES and any(i.device.type != "cpu" for i in inputs):
            if any(t.device.type == "cpu" for t in tree_flatten(out)[0] + written if isinstance(t, torch.Tensor)):
                self.report.to_host.append(name)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                key = _storage_key(t)
                if key is not None and key not in self.readable:
                    self.made.add(key)
        return out

    def _check(self, t: torch.Tensor, op: str, write: bool) -> None:
        key = _storage_key(t)
        if key is None or key in self.made:
            return  # opaque (a oneDNN-packed weight: registered by its module), or made by the step
        if key in self.readable:
            self.seen_static.add(key)
            if write and key not in self.writable:
                self.report.foreign_writes += 1
                self.report.foreign_examples.append(f"{op} writes a registered read-only tensor {tuple(t.shape)}")
            return
        if write:
            self.report.foreign_writes += 1
        else:
            self.report.foreign_reads += 1
        kind = "writes" if write else "reads"
        self.report.foreign_examples.append(f"{op} {kind} an unregistered tensor {tuple(t.shape)} {t.dtype}")

    @staticmethod
    def _written_arguments(func, args, kwargs) -> list[torch.Tensor]:
        """The arguments the op's schema marks as written (in-place and out= arguments)."""
        written = []
        for i, arg in enumerate(func._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            written += [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
        return written

    def __enter__(self):
        # outside inference mode (gradients still off): under it a CPU tensor's value is read
        # back without passing the dispatcher, so a host read would go unseen
        self._modes = [torch.inference_mode(False), torch.no_grad()]
        for mode in self._modes:
            mode.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        self.report.outside_read = len(self.seen_static)
        result = super().__exit__(*exc)
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        return result


def audit_steps(engine, steps: int) -> dict:
    """Run `steps` of `engine.step()` (rows must be queued or live) with every decode step's
    device work under StepAudit, against the runner's registered tensors; also whether those
    tensors kept their addresses across the steps. The engine's frames are not captured meanwhile
    (graphs replay what they recorded: the audit watches the eager step they record)."""
    runner = engine.runner
    readable, writable = runner.static_tensors()
    before = [t.data_ptr() for t in readable]
    reports: list[AuditReport] = []

    def watch():
        audit = StepAudit(readable, writable)
        reports.append(audit.report)
        return audit

    graphs, runner.graphs, runner.watch_step = runner.graphs, None, watch
    try:
        for _ in range(steps):
            engine.step()
    finally:
        runner.graphs, runner.watch_step = graphs, None
    after = [t.data_ptr() for t, _ in zip(runner.static_tensors()[0], before)]
    merged = AuditReport()
    for r in reports:
        merged.host_reads += r.host_reads
        merged.to_host += r.to_host
        merged.foreign_reads += r.foreign_reads
        merged.foreign_writes += r.foreign_writes
        merged.foreign_examples += r.foreign_examples
        merged.outside_read = max(merged.outside_read, r.outside_read)
    return merged.as_dict() | {"steps_audited": len(reports), "addresses_stable": before == after}
