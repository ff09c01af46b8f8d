"""Mixed clusters in the planner: work by each device type's speed and memory, against
planning every GPU as the slowest (``paracube plan --gpus 8xa100-80gb,8xv100``)."""

from __future__ import annotations

import itertools
import re
from dataclasses import replace

import pytest

from paracube.errors import ConfigError
from paracube.models.presets import preset
from paracube.planner.layout_memory import peak_memory, stage_bytes
from paracube.planner.mixed import (
    _split_by_speed,
    check_tp,
    parse_pools,
    pipeline_plans,
    plan_mixed,
)
from paracube.planner.search import host_holds
from paracube.planner.time_model import estimate

GPT = preset("gpt3-1.3b")


@pytest.fixture(scope="module")
def a100_v100():
    pools = parse_pools("8xa100-80gb,8xv100", 8)
    plans, slowest = plan_mixed(GPT, pools, 512)
    return pools, plans, slowest


def test_the_speed_aware_plan_beats_planning_all_as_the_slowest(a100_v100):
    """gpt3-1.3b on 8 A100-80GB + 8 V100: the best speed-aware plan is faster than the
    best plan on 16 V100s (the homogeneous search on the slowest type), here by 1.65×."""
    pools, plans, slowest = a100_v100
    best = plans[0]
    assert slowest is not None and slowest.layout.gpus == 16
    assert best.step_time < slowest.step_time
    assert best.tokens_per_s / slowest.tokens_per_s > 1.5  # 2.3x the speed on half the GPUs


def test_data_parallel_shares_follow_the_speeds_and_the_time_model(a100_v100):
    """Each pool's replicas take samples in proportion to their speed (A100 ÷ V100 sustained
    rates: 2.3×), and each pool's step is the time model's for its own micro-batch."""
    pools, plans, _ = a100_v100
    plan = next(p for p in plans if p.kind == "data parallel by speed")
    (fast, n_fast, b_fast), (slow, n_slow, b_slow) = plan.shares
    assert (fast, slow) == ("a100-80gb", "v100") and n_fast == n_slow == 8
    rate = {p.key: p.gpu.peak_flops * p.gpu.sustained_fraction for p in pools}
    assert max(b_fast) / max(b_slow) == pytest.approx(rate[fast] / rate[slow], rel=0.25)
    assert sum(plan.weights) * plan.layout.microbatches == 512
    for pool, (_, _, sizes), seconds in zip(pools, plan.shares, plan.pool_times):
        layout = replace(plan.layout, micro_batch=max(sizes))
        assert seconds == estimate(GPT, layout, pool.cluster, "fp16").step_time
        assert peak_memory(GPT, layout).total <= pool.gpu.memory_bytes
    assert plan.step_time == max(plan.pool_times)


def test_the_uneven_split_is_the_best_there_is():
    """Against every split of 12 samples per micro-step over 2 A100 and 2 V100 replicas
    (each ≥ 1, each fitting its memory): the planner's split has the least step time."""
    pools = parse_pools("2xa100-80gb,2xv100", 2)
    base = replace(
        plan_mixed(GPT, pools, 48, fixed={"tp": 1, "pp": 1, "zero": 1})[0][0].layout,
        microbatches=4,
    )
    plan, _ = _split_by_speed(GPT, pools, [2, 2], base, 12, "fp16")  # V100s: no bf16

    def step(weights):
        worst = 0.0
        for w, pool in zip(weights, [pools[0]] * 2 + [pools[1]] * 2):
            layout = replace(base, micro_batch=w)
            if peak_memory(GPT, layout).total > pool.gpu.memory_bytes:
                return float("inf")
            worst = max(worst, estimate(GPT, layout, pool.cluster, "fp16").step_time)
        return worst

    splits = [w for w in itertools.product(range(1, 12), repeat=4) if sum(w) == 12]
    assert plan.step_time == pytest.approx(min(step(w) for w in splits))
    assert plan.step_time == step(plan.weights)


def test_pipeline_stages_by_speed_and_memory():
    """gpt3-13b on 16 H100 + 16 A100-40GB: in every pipeline plan the stages on H100s hold
    at least as many blocks on average as those on A100s — more in the fastest plan (3.3×
    their sustained rate; its cut is printed by the CLI), the same only where memory binds
    both —, every stage fits its own GPU's memory, and the blocks add up to the model's."""
    pools = parse_pools("16xh100,16xa100-40gb", 8)
    cfg = preset("gpt3-13b")
    plans = pipeline_plans(cfg, pools, 512, "bf16", {"zero": 1, "recompute": "none"})
    assert plans
    fastest = min(plans, key=lambda plan: plan.step_time)
    for plan in plans:
        (fast, _, fast_blocks), (slow, _, slow_blocks) = plan.shares
        assert (fast, slow) == ("h100", "a100-40gb")  # the larger memory first
        more = sum(fast_blocks) / len(fast_blocks) - sum(slow_blocks) / len(slow_blocks)
        assert more > 0 if plan is fastest else more >= 0
        assert sum(fast_blocks) + sum(slow_blocks) == cfg.n_layers
        blocks = list(fast_blocks) + list(slow_blocks)
        memories = [pools[0].gpu.memory_bytes] * len(fast_blocks) + [
            pools[1].gpu.memory_bytes
        ] * len(slow_blocks)
        for k, (n, capacity) in enumerate(zip(blocks, memories)):
            assert stage_bytes(cfg, plan.layout, k, n).total <= capacity


def test_tensor_parallel_groups_stay_in_one_device_type():
    pools = parse_pools("8xa100-80gb,4xv100", 8)
    check_tp(pools, 4)
    with pytest.raises(ConfigError, match="tp=8 cannot stay within one device type"):
        check_tp(pools, 8)
    for plan in plan_mixed(GPT, pools, 96)[0]:
        assert plan.layout.tp <= 4


def test_the_emitted_command_is_a_valid_train_job(capsys):
    """The launch line of the best data-parallel plan parses with `paracube train`'s own
    parser and validation, and its --dp-balance gives each rank its planned share."""
    from paracube.cli import build_parser, config_from_args, main

    assert (
        main(["plan", "--model", "gpt3-1.3b", "--gpus", "8xa100-80gb,8xv100", "--global-batch",
              "512", "--emit", "torchrun", "--explain"]) == 0
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "÷ all as slowest" in out and "saved per step" in out and "Why data parallel" in out
    line = next(x for x in out.splitlines() if x.startswith("torchrun"))
    argv = line.split(" -m paracube ", 1)[1].split()
    cfg = config_from_args(build_parser().parse_args(argv))
    assert cfg.global_batch == 512 and cfg.parallel.dp == 16
    weights = [int(w) for w in argv[argv.index("--dp-balance") + 1].split(",")]
    shares = cfg.data_split().shares
    assert [s // cfg.grad_accum for s in shares] == weights


def test_pipeline_stages_are_timed_at_the_precisions_matmul_rate():
    """A mixed pipeline's stages run on the precision's matmul units, as a homogeneous
    plan's do: fp32 on the CUDA cores is far slower than fp16 on the tensor cores, fp8 is
    refused where a pool has no FP8 units, and bf16 where one has no bfloat16 units."""
    pools = parse_pools("8xa100-80gb,8xv100", 8)
    fixed = {"zero": 1, "recompute": "full", "tp": 1, "pp": 2, "micro_batch": 1}

    def fastest(precision: str) -> float:
        return min(p.step_time for p in pipeline_plans(GPT, pools, 64, precision, fixed))

    assert fastest("fp32") > 3 * fastest("fp16")
    with pytest.raises(ConfigError, match="has no FP8 tensor cores"):
        pipeline_plans(GPT, pools, 64, "fp8", fixed)
    with pytest.raises(ConfigError, match="V100 SXM2 32GB has no bfloat16 tensor cores"):
        pipeline_plans(GPT, pools, 64, "bf16", fixed)


def test_a_stated_software_fact_is_planned_not_a_reason_to_find_nothing(a100_v100):
    """The mixed planners build their layouts with the software the job states (as the
    one-type search does): gradients reduced in bf16 are planned — every plan carries them,
    and the reduction moving half the bytes makes the best plan no slower — where they once
    matched no layout and the cluster was said to fit nothing."""
    pools, plans, _ = a100_v100
    stated, _ = plan_mixed(GPT, pools, 512, fixed={"grad_reduce": "compute"})
    assert stated and all(plan.layout.grad_reduce == "compute" for plan in stated)
    assert stated[0].step_time <= plans[0].step_time
    kinds = {plan.kind for plan in stated}
    assert {"data parallel by speed", "pipeline stages by speed"} <= kinds


def test_a_stack_is_planned_only_with_what_it_runs_on_a_mixed_cluster(a100_v100):
    """Composer runs FSDP alone: on a mixed cluster its plans, and the all-as-the-slowest one
    they are measured against, are data parallel only (stacks.STACK_CHOICES)."""
    from paracube.planner.stacks import stack, stack_choices

    pools, _, _ = a100_v100
    plans, slowest = plan_mixed(GPT, pools, 512, fixed=stack("composer"),
                                allowed=stack_choices("composer"))  # fmt: skip
    assert plans and slowest is not None
    assert all((p.layout.tp, p.layout.pp) == (1, 1) for p in [*plans, slowest])
    assert all(p.layout.zero in (0, 2, 3) for p in [*plans, slowest])


def test_the_mixed_header_says_whose_software_it_plans(capsys):
    """As the one-type plan does: --stack fsdp on a mixed cluster heads its table with the
    stack it plans for, and the plans carry that stack's software (FSDP2's copy-out)."""
    import json

    from paracube.cli import main

    argv = ["plan", "--model", "gpt3-1.3b", "--gpus", "8xa100-80gb,8xv100", "--global-batch",
            "64", "--top", "1", "--stack", "fsdp"]  # fmt: skip
    assert main(argv) == 0
    assert ", fp16, as fsdp runs it;" in capsys.readouterr().out.splitlines()[0]
    assert main([*argv, "--json"]) == 0
    layout = json.loads(capsys.readouterr().out)["plans"][0]["layout"]
    assert layout["param_gather"] == "per-parameter"


@pytest.mark.parametrize(
    ("budget", "words", "tokens"),
    [
        (["--epochs", "3", "--train-samples", "1e6"], "3 epochs of 1,000,000 samples",
         3e6 * preset("gpt3-1.3b").seq_len),
        (["--train-tokens", "5B"], "5B tokens", 5e9),
    ],
)  # fmt: skip
def test_a_training_budget_on_a_mixed_cluster_is_its_time_at_each_plans_rate(
    capsys, budget, words, tokens
):
    """--epochs and --train-tokens are answered on a mixed cluster too (--epochs was
    ignored): the budget's tokens over each plan's tokens/s, for the speed-aware plan and
    for all planned as the slowest."""
    import json
    import re

    from paracube.cli import main

    argv = ["plan", "--model", "gpt3-1.3b", "--gpus", "8xa100-80gb,8xv100", "--global-batch",
            "128", "--top", "1"]  # fmt: skip
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rate, slowest = out["plans"][0]["tokens_per_s"], out["all_as_slowest"]["tokens_per_s"]
    assert main([*argv, *budget]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    found = re.fullmatch(
        rf"Time to train {words}: ([\d.,]+) h with data parallel by speed, "
        r"against ([\d.,]+) h with all as the slowest\.",
        line,
    )
    assert found, line
    hours = [float(g.replace(",", "")) for g in found.groups()]
    assert hours == pytest.approx([tokens / r / 3600 for r in (rate, slowest)], rel=0.01)
    assert out["time_to_train"] is None  # no budget asked for
    assert main([*argv, *budget, "--json"]) == 0
    timed = json.loads(capsys.readouterr().out)["time_to_train"]
    assert timed["tokens"] == pytest.approx(tokens)
    seconds = [timed["seconds"], timed["all_as_slowest_seconds"]]
    assert [s / 3600 for s in seconds] == pytest.approx(hours, rel=0.01)


def test_tensor_parallel_groups_tile_each_pools_nodes():
    """A pool of 24 GPUs on 8-GPU nodes takes tp 1, 2, 4, 8 — not 6, whose groups of
    consecutive ranks would span two nodes (it divides 24); a pool smaller than a node is
    one node and takes any tp dividing it; a fixed tp=6 is refused by name."""
    from paracube.planner.pools import check_tp, parse_pools, tp_fits_nodes

    big, small = parse_pools("24xa100-80gb,6xv100", 8)
    assert [t for t in (1, 2, 3, 4, 6, 8) if tp_fits_nodes(big, t)] == [1, 2, 4, 8]
    assert [t for t in (1, 2, 3, 6, 8) if tp_fits_nodes(small, t)] == [1, 2, 3, 6]
    with pytest.raises(ConfigError, match="tp=6 cannot stay within one device type"):
        check_tp([big, small], 6)


def test_a_pipeline_is_cut_as_the_engine_cuts_it_the_head_a_layer_of_its_own():
    """The speed-aware pipeline cuts the engine's chain (embed, blocks, norm, head: what
    ``--balance speed`` partitions), so the last stage may hold the head alone. gpt3-1.3b on
    1 H100 + 16 V100s: the head outweighs a block on a V100, and the best plan's last stage
    holds no block — the plan that had to give it one ran 0.72× the all-as-the-slowest plan,
    this one beats it. Its busiest stage is the least of every cut of the chain (brute force
    over a 1 + 2 stage pipeline of a 6-block model)."""
    pools = parse_pools("1xh100,16xv100", 8)
    plans, slowest = plan_mixed(GPT, pools, 128)
    best = plans[0]
    assert best.kind == "pipeline stages by speed" and best.shares[-1][2][-1] == 0
    assert sum(sum(blocks) for _, _, blocks in best.shares) == GPT.n_layers
    assert slowest is not None and best.step_time < slowest.step_time
    from paracube.cli.plan_mixed import where

    assert where(best).endswith("blocks and one of the head alone")

    small = replace(GPT, n_layers=6, name="gpt-6")
    pools = parse_pools("1xh100,2xv100", 8)
    fixed = {"zero": 0, "recompute": "none", "tp": 1, "micro_batch": 1, "schedule": "1f1b"}
    plan = min(pipeline_plans(small, pools, 8, "fp16", fixed), key=lambda p: p.step_time)
    block = {k: b for k, b in zip(("h100", "v100"), _stage_loads(small, pools, plan.layout))}
    chain = [0.0, *[None] * small.n_layers, 0.0, "head"]  # embed, blocks, norm, head

    def load(pool: str, layer: int) -> float:
        if chain[layer] is None:
            return block[pool][0]
        return block[pool][1] if chain[layer] == "head" else 0.0

    stage_pool = ["h100", "v100", "v100"]
    n = len(chain)
    cuts = [(i, j) for i in range(1, n) for j in range(i + 1, n)]
    least = min(
        max(
            sum(load(stage_pool[k], x) for x in range(a, b))
            for k, (a, b) in enumerate([(0, i), (i, j), (j, n)])
        )
        for i, j in cuts
    )
    assert max(plan.pool_times) == pytest.approx(least)


def _stage_loads(cfg, pools, layout):
    """(a block's, the head's) seconds per micro-batch on each pool, as the pipeline plan
    times them (forward, backward and the tensor-parallel collectives; no recomputation)."""
    from paracube.planner.time_model import head_time, layer_time

    out = []
    for pool in pools:
        fwd, bwd, _ = layer_time(cfg, layout, pool.gpu, 2, False)
        out.append((fwd + bwd, head_time(cfg, layout, pool.gpu, 2)))
    return out


def test_the_headline_says_when_the_uniform_plan_is_the_faster():
    """Never a negative saving: where the all-as-the-slowest plan is faster (its search
    ranges over layouts the speed-aware ones do not), the headline says to run it."""
    from paracube.cli.plan_mixed import headline
    from paracube.planner.layout import Layout
    from paracube.planner.pools import MixedPlan

    pools = parse_pools("8xa100-80gb,8xv100", 8)
    layout = Layout(dp=16)
    fast = MixedPlan("all as the slowest", layout, 2.0, 100.0)
    slow = MixedPlan("pipeline stages by speed", layout, 3.0, 66.7)
    line = headline(slow, fast, pools)
    assert "1 s more than the 2 s" in line and "run that one" in line
    assert not re.search(r"-\d", line)


def test_a_pool_smaller_than_a_node_gets_its_own_launch_line(capsys):
    """1 H100 + 16 V100s on nodes of 8: three nodes, the H100's running one rank and each
    V100 node eight — a line per device type (torchrun's agents may differ in
    --nproc-per-node), where one line for all would have started 24 ranks for 17 GPUs."""
    from paracube.cli import build_parser, config_from_args, main

    argv = ["plan", "--model", "gpt3-1.3b", "--gpus", "1xh100,16xv100", "--global-batch", "128",
            "--emit", "torchrun"]  # fmt: skip
    assert main(argv) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("torchrun")]
    procs = [int(x.split("--nproc-per-node ")[1].split()[0]) for x in lines]
    nodes = {int(x.split("--nnodes ")[1].split()[0]) for x in lines}
    assert procs == [1, 8] and nodes == {3} and 1 + 2 * 8 == 17
    for line in lines:
        cfg = config_from_args(build_parser().parse_args(line.split(" -m paracube ", 1)[1].split()))
        assert cfg.parallel.pp == 17


def test_the_headline_says_when_the_speeds_gain_nothing():
    """H100 and H200 share a compute rate: a saving inside the model's 0.5 % is said as
    none, not as "0 s saved per step (0%)"."""
    from paracube.cli.plan_mixed import headline
    from paracube.planner.layout import Layout
    from paracube.planner.pools import MixedPlan

    pools = parse_pools("16xh100,16xh200", 8)
    layout = Layout(dp=32)
    line = headline(MixedPlan("x", layout, 29.3, 1.0), MixedPlan("y", layout, 29.31, 1.0), pools)
    assert "differ too little in speed" in line and "saved" not in line


def test_a_model_that_fits_only_offloaded_is_planned_offloaded_on_a_mixed_cluster():
    """Llama 3 70B on 4 H800 + 4 H100 fits only with the optimizer in host memory, as the
    all-as-the-slowest search plans it; the speed-aware plans take it there too (they had
    found nothing, and the CLI said the model fits no plan). Every offloaded plan fits each
    GPU and its host's share of the node's RAM; with --offload none nothing fits at all."""
    cfg = preset("llama3-70b")
    pools = parse_pools("4xh800,4xh100", 8)
    plans, slowest = plan_mixed(cfg, pools, 96)
    assert slowest is not None and slowest.layout.offload
    assert plans and all(plan.layout.offload for plan in plans)
    assert {plan.kind for plan in plans} == {"data parallel by speed", "pipeline stages by speed"}
    for plan in plans:
        if plan.kind.startswith("data parallel"):
            for pool, (_, _, sizes) in zip(pools, plan.shares):
                layout = replace(plan.layout, micro_batch=max(sizes))
                assert peak_memory(cfg, layout, "bf16").total <= pool.gpu.memory_bytes
                assert host_holds(cfg, layout, pool.gpu, "bf16")
    assert plan_mixed(cfg, pools, 96, fixed={"offload": False}) == ([], None)
    # each kind's launch line is a train job paracube's parser and validation take, the
    # optimizer in host memory beside the uneven shares or the speed-cut stages
    from paracube.cli import build_parser, config_from_args
    from paracube.cli.plan_mixed import torchrun_command

    for kind, balance in (("data parallel", "--dp-balance"), ("pipeline", "--balance")):
        plan = next(p for p in plans if p.kind.startswith(kind))
        line = torchrun_command(plan, "llama3-70b", 8, "bf16", None, pools)
        argv = line.split(" -m paracube ", 1)[1].split()
        assert "--offload" in argv and balance in argv
        job = config_from_args(build_parser().parse_args(argv))
        assert job.offload == "optimizer" and job.global_batch == 96
