"""What of a :class:`~paracube.engine.Trainer` goes into a checkpoint, as pieces and facts.

Tensors (:func:`trainer_pieces`): the fp32 main values of every parameter — the model's
weights under fp32, the master weights under bf16/fp16 (the compute-dtype copy is
rebuilt from them on load) — and every optimizer state shaped like its parameter
(Adam's moments), each under the serial name: ``model/<name>``, ``optim.<state>/<name>``.
One owner per element: the data-parallel rank that steps it (under ZeRO ≥ 1; under ZeRO-0
each rank writes its 1/dp part of the replicated buffers), tensor-parallel rank 0 for
replicated tensors, the first stage for a tied embedding/head.

Facts (:func:`trainer_facts`, JSON): the step, the optimizer's scalar states (Adam's step
count), the fp16 loss scaler. The data sampler needs nothing more: a step's batch is a
pure function of (seed, step). Each rank's generator states are saved beside them
(:mod:`paracube.checkpoint.rng`) for models that draw during training (dropout).
"""

from __future__ import annotations

import torch

from paracube.checkpoint.pieces import Piece, param_pieces


def trainer_pieces(trainer) -> list[Piece]:
    mesh, opt = trainer.mesh, trainer.optimizer
    names = {id(p): n for n, p in trainer.parallel.serial_named_parameters()}
    tp = (mesh.rank("tp"), mesh.size("tp"))
    # a tied weight's later name (a head on the last stage): the copy of the first's, saved
    # under the first's name by the stage that holds it under that name
    aliases = trainer.parallel.tied_aliases
    pieces: list[Piece] = []
    for shard, main, entries in opt.held():
        owned = _owned_range(shard, main.numel(), mesh.rank("dp"), mesh.size("dp"))
        for seg in shard.segments:
            name = names[id(seg.param)]
            key = aliases.get(name, name)
            tied = key != name
            for x0, x1, owner in _runs(seg.start, seg.stop, owned):
                offset = seg.param_offset + (x0 - seg.start)
                owner = owner and not tied
                data = main[x0:x1]
                pieces += param_pieces(f"model/{key}", seg.param, data, offset, tp, owner)
                pieces += _state_pieces(opt, entries, seg.param, key, x0, x1, offset, tp, owner)
    return pieces


def _owned_range(shard, n: int, dp_rank: int, dp: int) -> tuple[int, int]:
    """The elements of a shard this rank writes: all of a ZeRO ≥ 1 slice (it is the only
    holder), or its 1/dp part of a replicated ZeRO-0 buffer (so that every data-parallel
    rank writes a share in parallel, not rank 0 all of it)."""
    if shard.sharded or dp == 1:
        return 0, n
    size = -(-n // dp)
    return min(n, dp_rank * size), min(n, (dp_rank + 1) * size)


def _runs(start: int, stop: int, owned: tuple[int, int]):
    """``[start, stop)`` cut at the owned range's ends: ``(a, b, owned)`` runs."""
    cuts = sorted({start, stop, *(c for c in owned if start < c < stop)})
    for a, b in zip(cuts, cuts[1:]):
        yield a, b, owned[0] <= a and b <= owned[1]


def _state_pieces(opt, entries, param, key, x0, x1, offset, tp, owner) -> list[Piece]:
    """The optimizer states (shaped like their main parameter) of shard elements [x0, x1)."""
    pieces: list[Piece] = []
    for p, a, b in entries:
        lo, hi = max(a, x0), min(b, x1)
        if lo >= hi:
            continue
        for state, value in opt.optimizer.state[p].items():
            if torch.is_tensor(value) and value.shape == p.shape:
                part = value[lo - a : hi - a]
                at = offset + (lo - x0)
                pieces += param_pieces(f"optim.{state}/{key}", param, part, at, tp, owner)
    return pieces


def trainer_facts(trainer) -> dict:
    """The non-tensor state, the same on every rank."""
    opt = trainer.optimizer
    scalars: dict[str, float] = {}
    for p in opt.main_params[:1]:
        for state, value in opt.optimizer.state[p].items():
            if not (torch.is_tensor(value) and value.shape == p.shape):
                scalars[state] = float(value)
    scaler = trainer.scaler
    return {
        "step": trainer.step,
        "optimizer_scalars": scalars,
        "loss_scaler": None
        if scaler is None
        else {k: getattr(scaler, k) for k in ("scale", "_clean", "skipped", "consecutive")},
    }


def restore_facts(trainer, facts: dict) -> None:
    """Set what :func:`trainer_facts` recorded (the tensors are loaded in place)."""
    trainer.step = facts["step"]
    opt = trainer.optimizer
    for p in opt.main_params:
        state = opt.optimizer.state[p]
        for name, value in facts["optimizer_scalars"].items():
            if torch.is_tensor(state.get(name)):
                state[name].fill_(value)
            else:
                state[name] = value
    if trainer.scaler is not None and facts.get("loss_scaler"):
        for k, v in facts["loss_scaler"].items():
            setattr(trainer.scaler, k, v)
