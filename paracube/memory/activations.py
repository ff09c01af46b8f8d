"""Counting the bytes autograd keeps for backward — the activation memory — on any device.

CPU has no allocator statistics, so activation memory is *counted* (docs/ARCHITECTURE.md): a
``saved_tensors_hooks`` pair sees every tensor an operation saves for its backward; the
counter charges the tensor's *storage* the first time it is saved (views of one storage
— q, k and v cut from one fused projection — are one allocation) and releases it when the
last saved reference is dropped, i.e. when backward has consumed the node (or the graph
is freed). ``live`` is then the activation memory held at any moment, and ``peak`` its
maximum over the step — under a pipeline schedule, over all in-flight micro-batches.

Parameters (and views of them, e.g. a transposed weight) are saved by reference and are
model state, not activations: they are not counted. Activation checkpointing keeps the
region's *inputs* alive instead of what it would save; :func:`note_saved` charges those.
"""

from __future__ import annotations

import torch

_ACTIVE: list[ActivationCounter] = []


def _is_parameter(t: torch.Tensor) -> bool:
    base = t._base if t._base is not None else t
    return base.is_leaf and base.requires_grad


class _Saved:
    """A saved tensor as autograd holds it while our hooks are on; its lifetime is the
    saved reference's lifetime."""

    __slots__ = ("tensor", "counter", "key", "__weakref__")

    def __init__(self, counter: ActivationCounter, tensor: torch.Tensor):
        self.tensor, self.counter, self.key = tensor, counter, None
        if not _is_parameter(tensor) and tensor.device.type != "meta":
            storage = tensor.untyped_storage()
            self.key = (storage.data_ptr(), tensor.device)
            counter._acquire(self.key, storage.nbytes())

    def __del__(self) -> None:
        # torch.compile's tracing of a checkpointed region builds copies of the hooks'
        # results without __init__ (nothing was acquired for them)
        key = getattr(self, "key", None)
        if key is not None:
            self.counter._release(key)


class ActivationCounter:
    """``with counter:`` counts activation bytes saved inside; ``live`` and ``peak`` in bytes.

    Re-entering is allowed (each pipeline action enters it); counts persist across entries
    until :meth:`reset_peak`.
    """

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self._refs: dict[tuple, list[int]] = {}  # storage key -> [references, bytes]
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._depth = 0

    def _acquire(self, key, nbytes: int) -> None:
        entry = self._refs.get(key)
        if entry is None:
            self._refs[key] = [1, nbytes]
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        else:
            entry[0] += 1

    def _release(self, key) -> None:
        entry = self._refs.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            del self._refs[key]
            self.live -= entry[1]

    def pack(self, tensor: torch.Tensor) -> _Saved:
        return _Saved(self, tensor)

    def reset_peak(self) -> None:
        self.peak = self.live

    def __enter__(self) -> ActivationCounter:
        if self._depth == 0:
            hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda s: s.tensor)
            hooks.__enter__()
            self._hooks = hooks
            _ACTIVE.append(self)
        self._depth += 1
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            _ACTIVE.remove(self)
            if self._hooks is not None:
                self._hooks.__exit__(*exc)
            self._hooks = None


def note_saved(*tensors: torch.Tensor) -> tuple:
    """Charge ``tensors`` as saved for backward (the inputs a checkpointed region keeps
    for its recomputation). Returns tokens; keep them alive exactly as long as the tensors
    are kept (pass them into the checkpointed function's arguments)."""
    if not _ACTIVE or not torch.is_grad_enabled():
        return ()
    counter = _ACTIVE[-1]
    return tuple(counter.pack(t) for t in tensors)
