"""What of a :class:`~paracube.engine.Trainer` goes into a checkpoint, as pieces and facts.

Tensors (:func:`trainer_pieces`): the fp32 main values of every parameter — the model's
weights under fp32, the master weights under bf16/fp16 (the compute-dtype copy is
rebuilt from them on load) — and every optimizer state shaped like its parameter
(Adam's moments), each under the serial name: ``model/<name>``, ``optim.<state>/<name>``.
One owner per element: the data-parallel rank that steps it (any under ZeRO ≥ 1, rank 0
of a replicated ZeRO-0 group), tensor-parallel rank 0 for replicated tensors, the first
stage for a tied embedding/head.

Facts (:func:`trainer_facts`, JSON): the step, the optimizer's scalar states (Adam's step
count), the fp16 loss scaler. The data sampler needs nothing more: a step's batch is a
pure function of (seed, step). There is no other randomness after initialisation.
"""

from __future__ import annotations

import torch

from paracube.checkpoint.pieces import Piece, param_pieces


def trainer_pieces(trainer) -> list[Piece]:
    mesh, opt = trainer.mesh, trainer.optimizer
    names = {id(p): n for n, p in trainer.parallel.serial_named_parameters()}
    tp = (mesh.rank("tp"), mesh.size("tp"))
    last_stage = mesh.rank("pp") == mesh.size("pp") - 1
    tied_copy = trainer.cfg.model.tie_embeddings and mesh.size("pp") > 1 and last_stage
    pieces: list[Piece] = []
    for shard, main, entries in opt.held():
        dp_owner = shard.sharded or mesh.rank("dp") == 0
        for seg in shard.segments:
            name = names[id(seg.param)]
            owner = dp_owner
            if tied_copy and name == "head.weight":  # the first stage's embedding is the one
                name, owner = "embed.tok.weight", False
            data = main[seg.start : seg.stop]
            pieces += param_pieces(f"model/{name}", seg.param, data, seg.param_offset, tp, owner)
            for p, a, b in entries:
                x0, x1 = max(a, seg.start), min(b, seg.stop)
                if x0 >= x1:
                    continue
                offset = seg.param_offset + (x0 - seg.start)
                for state, value in opt.optimizer.state[p].items():
                    if torch.is_tensor(value) and value.shape == p.shape:
                        part = value[x0 - a : x1 - a]
                        key = f"optim.{state}/{name}"
                        pieces += param_pieces(key, seg.param, part, offset, tp, owner)
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
