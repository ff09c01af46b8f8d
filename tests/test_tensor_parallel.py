"""Tensor parallelism: layers, the GPT plan and training, against the serial model."""

from __future__ import annotations

import copy

import pytest
import torch

from paracube.models.presets import preset
from paracube.planner.volumes import total_wire_bytes, tp_layer_payload
from tests.helpers import SEQ, ZERO_GRADIENT_PARAMS, assert_losses_close, assert_params_close, rel_err, serial_cached, small_corpus, train_config

B = 2

# -- helpers that run on the ranks ---------------------------------------------------------


def _gather(t: torch.Tensor, dim: int) -> torch.Tensor:
    import torch.distributed as dist

    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim=dim)


def _full_grads(module) -> dict[str, torch.Tensor]:
    return {
        n: _gather(p.grad, p.tp_dim) if getattr(p, "tp_dim", None) is not None else p.grad.clone()
        for n, p in module.named_parameters()
    }


def worked_example():
    """A 1024×1024 weight in 4 shards of 256×1024: each rank multiplies its shard, an
    all-gather reassembles the output."""
    from paracube.tensor_parallel import ColumnParallelLinear

    torch.manual_seed(0)
    full = torch.nn.Linear(1024, 1024, bias=False)
    x = torch.randn(8, 1024)
    layer = ColumnParallelLinear.from_linear(full, None, gather_output=True, input_mode=None)
    return tuple(layer.weight.shape), layer(x), full(x)


def block_parity(sp: bool):
    """One transformer block, serial vs tensor-parallel: output, input gradient, weight
    gradients, and the bytes each collective moved in one forward + backward."""
    import torch.distributed as dist

    from paracube.comm.ledger import CommLedger
    from paracube.models.gpt import Block
    from paracube.tensor_parallel import TPContext, apply_plan, gpt_plan, sequence_parallel_params
    from paracube.tensor_parallel import sync_sequence_parallel_grads

    cfg = preset("nano", seq_len=SEQ)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    serial = Block(cfg)
    parallel = copy.deepcopy(serial)
    block_plan = {k[len("blocks.*.") :]: v for k, v in gpt_plan(cfg).items() if k.startswith("blocks.*.")}
    ledger = CommLedger()
    apply_plan(parallel, block_plan, TPContext(None, ledger, sp))
    x = torch.randn(B, SEQ, cfg.hidden, requires_grad=True)
    dy = torch.randn(B, SEQ, cfg.hidden)
    serial(x).backward(dy)

    x_par = x.detach().clone().requires_grad_()
    chunk = SEQ // world
    inp = x_par[:, rank * chunk : (rank + 1) * chunk] if sp else x_par
    ledger.reset()
    out = parallel(inp)
    out.backward(dy[:, rank * chunk : (rank + 1) * chunk] if sp else dy)
    counted = ledger.snapshot()
    sync_sequence_parallel_grads(sequence_parallel_params(parallel), None)
    if sp:
        out = _gather(out.detach(), 1)
        dist.all_reduce(x_par.grad)  # each rank holds the gradient of its own tokens
    return out.detach(), serial(x).detach(), x_par.grad, x.grad, _full_grads(parallel), _full_grads(serial), counted


def vocab_pieces():
    """Vocabulary-parallel embedding and cross-entropy against nn.Embedding and F.cross_entropy."""
    import torch.nn.functional as F

    from paracube.comm.ledger import CommLedger
    from paracube.tensor_parallel import ColumnParallelLinear, VocabParallelEmbedding, vocab_parallel_cross_entropy

    torch.manual_seed(0)
    emb, head = torch.nn.Embedding(256, 32), torch.nn.Linear(32, 256, bias=False)
    pemb = VocabParallelEmbedding.from_embedding(emb, None)
    phead = ColumnParallelLinear.from_linear(head, None)
    tokens, targets = torch.randint(0, 256, (B, SEQ)), torch.randint(0, 256, (B, SEQ))
    want = F.cross_entropy(head(emb(tokens)).flatten(0, 1), targets.flatten())
    want.backward()
    ledger = CommLedger()
    got = vocab_parallel_cross_entropy(phead(pemb(tokens)), targets, None, ledger)
    got.backward()
    return (
        got.detach(), want.detach(),
        _gather(pemb.weight.grad, 0), emb.weight.grad, _gather(phead.weight.grad, 0), head.weight.grad,
        ledger.snapshot(),
    )


def run_tp_trainer(cfg):
    from paracube.config import ParallelConfig
    from paracube.engine import Trainer
    from paracube.mesh.mesh import ProcessMesh
    from paracube.tensor_parallel import full_parameters

    p = cfg.parallel
    trainer = Trainer(cfg, ProcessMesh(ParallelConfig(dp=p.dp, tp=p.tp)), small_corpus())
    losses = [trainer.train_step().loss for _ in range(cfg.steps)]
    return losses, full_parameters(trainer.module, trainer.tp_group)


# -- tests ------------------------------------------------------------------------------------


def test_worked_example_1024_in_4_shards(pools):
    for shape, got, want in pools(4).run(worked_example):
        assert shape == (256, 1024)
        assert rel_err(got, want) <= 1e-6


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "tp+sp"])
def test_block_matches_serial_and_bytes_match_formula(pools, world, sp):
    cfg = preset("nano", seq_len=SEQ)
    for out, want_out, dx, want_dx, grads, want_grads, counted in pools(world).run(block_parity, sp):
        assert rel_err(out, want_out) <= 1e-5
        assert rel_err(dx, want_dx) <= 1e-5
        for name in want_grads:
            if name.endswith(ZERO_GRADIENT_PARAMS):  # true gradient is exactly 0: compare noise levels
                assert grads[name].norm() < 1e-5 and want_grads[name].norm() < 1e-5
                continue
            assert rel_err(grads[name], want_grads[name]) <= 1e-5, name
        expected = tp_layer_payload(B, SEQ, cfg.hidden, world, bytes_per_element=4, sequence_parallel=sp)
        measured = {k.split("/")[0]: v["bytes"] for k, v in counted.items()}
        assert measured == expected
    plain = tp_layer_payload(B, SEQ, cfg.hidden, world, bytes_per_element=4, sequence_parallel=False)
    assert total_wire_bytes(expected, world) == total_wire_bytes(plain, world)  # SP moves the same bytes


def test_vocab_parallel_embedding_and_loss(pools):
    for got, want, demb, want_demb, dhead, want_dhead, counted in pools(2).run(vocab_pieces):
        assert rel_err(got, want) <= 1e-6
        assert rel_err(demb, want_demb) <= 1e-5 and rel_err(dhead, want_dhead) <= 1e-5
        # the loss never gathers logits: two all-reduces of (B, T) floats (max, then [target, sum-exp])
        assert counted["all_reduce/tp_loss"] == {"calls": 2, "bytes": 3 * B * SEQ * 4, "seconds": counted["all_reduce/tp_loss"]["seconds"]}


LLAMA_NANO = preset("nano", seq_len=SEQ, norm="rmsnorm", activation="swiglu", position="rope", bias=False,
                    n_kv_heads=2, ffn_hidden=96)


@pytest.mark.parametrize(
    "dp,tp,sp,model",
    [
        (1, 2, False, None), (1, 2, True, None), (1, 4, False, None), (1, 4, True, None),
        (2, 2, False, None), (2, 2, True, None), (1, 2, True, LLAMA_NANO),
        (1, 2, False, preset("nano", seq_len=SEQ, tie_embeddings=True)),
    ],
    ids=["tp2", "tp2-sp", "tp4", "tp4-sp", "dp2xtp2", "dp2xtp2-sp", "tp2-sp-llama", "tp2-tied"],
)
def test_training_matches_serial(pools, dp, tp, sp, model):
    """20 optimizer steps: loss per step and every (reassembled) parameter equal the serial run."""
    kw = {"model": model} if model is not None else {}
    cfg = train_config(dp=dp, tp=tp, sp=sp, micro_batch=8 // dp, steps=20, **kw)
    want_losses, want_params = serial_cached(cfg.global_batch, cfg.steps, model)
    for losses, params in pools(dp * tp).run(run_tp_trainer, cfg):
        assert_losses_close(losses, want_losses)
        assert_params_close(params, want_params)
