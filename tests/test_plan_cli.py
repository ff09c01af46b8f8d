"""``paracube plan``: the guide's scenarios, output formats, and bad input (pure, no processes)."""

from __future__ import annotations

import json

import pytest

from paracube.cli import main
from paracube.models.presets import preset
from paracube.planner.hardware import interconnect


def plan(capsys, *argv) -> str:
    assert main(["plan", *argv]) == 0
    return capsys.readouterr().out


def error(capsys, *argv) -> str:
    assert main(["plan", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("paracube: error: ")
    return err


def best(capsys, *argv) -> dict:
    return json.loads(plan(capsys, *argv, "--json"))["candidates"][0]


def seconds(text: str) -> float:
    """A time as the plan's texts print it ("0.376 ms", "1.46 s", "1,683 s"), in seconds."""
    number, unit = text.replace(",", "").split()
    return float(number) * {"s": 1.0, "ms": 1e-3}[unit]


def test_small_model_on_one_node_is_data_parallel(capsys):
    """4 × A100-80GB, a model under 3B parameters: plain data parallel."""
    layout = best(capsys, "--model", "gpt3-1.3b", "--gpus", "4", "--global-batch", "256")["layout"]
    assert (layout["dp"], layout["tp"], layout["pp"]) == (
        4,
        1,
        1,
    )  # with or without ZeRO's sharding


def test_7b_on_one_node_needs_sharding(capsys):
    """A 7B model on the same node: its 16 bytes per parameter don't fit one GPU, so ZeRO or
    tensor parallelism, with data parallelism over the rest."""
    layout = best(capsys, "--model", "llama2-7b", "--gpus", "4", "--global-batch", "256")["layout"]
    assert layout["zero"] > 0 or layout["tp"] > 1
    assert layout["dp"] > 1


def test_big_model_keeps_tensor_parallel_inside_the_node(capsys):
    out = plan(
        capsys, "--model", "llama2-70b", "--gpus", "512", "--global-batch", "1024", "--explain"
    )
    cand = best(capsys, "--model", "llama2-70b", "--gpus", "512", "--global-batch", "1024")
    assert 1 < cand["layout"]["tp"] <= 8  # model parallel inside the node, never across
    assert "stays inside a node" in out
    piped = plan(
        capsys, "--model", "llama2-70b", "--gpus", "512", "--global-batch", "1024",
        "--layout", "dp=16,tp=8,pp=4", "--explain",
    )  # fmt: skip
    assert "Pipeline 4 splits the 80 layers" in piped
    assert "selective recompute cuts activation memory by" in out and "full recompute" in out


def test_layout_flag_evaluates_that_layout(capsys):
    cands = json.loads(
        plan(
            capsys,
            "--model",
            "gpt3-13b",
            "--gpus",
            "64",
            "--global-batch",
            "512",
            "--layout",
            "dp=4,tp=8,pp=2",
            "--json",
            "--top",
            "50",
        )
    )["candidates"]
    assert cands and all(
        (c["layout"]["dp"], c["layout"]["tp"], c["layout"]["pp"]) == (4, 8, 2) for c in cands
    )
    c = cands[0]
    assert c["memory"]["total"] > c["memory"]["model_states"] > 0 and 0 < c["time"]["mfu"] < 1


def test_custom_shape_and_emit_torchrun(capsys):
    out = plan(
        capsys,
        "--layers",
        "24",
        "--hidden",
        "2048",
        "--heads",
        "16",
        "--vocab",
        "51200",
        "--seq",
        "2048",
        "--gpus",
        "16",
        "--global-batch",
        "128",
        "--emit",
        "torchrun",
    )
    assert "torchrun --nnodes 2 --nproc-per-node 8" in out and "-m paracube train" in out


@pytest.mark.parametrize(
    "model,gpus,batch",
    [("llama2-7b", 8, 64), ("gpt3-13b", 32, 256), ("llama2-70b", 64, 512), ("qwen2.5-7b", 8, 64)],
)
def test_emitted_command_is_a_valid_train_job(capsys, model, gpus, batch):
    """The launch line the planner prints is accepted by `paracube train` as it stands:
    same layout, ZeRO stage, recomputation and precision, the product equal to the GPUs."""
    import shlex

    from paracube.cli import build_parser, config_from_args
    from paracube.validate import validate

    out = plan(
        capsys,
        "--model",
        model,
        "--gpus",
        str(gpus),
        "--global-batch",
        str(batch),
        "--emit",
        "torchrun",
    )
    line = next(x for x in out.splitlines() if x.startswith("torchrun "))
    argv = shlex.split(line.split(" -m paracube ", 1)[1])
    cfg = config_from_args(build_parser().parse_args(argv))
    validate(cfg, gpus, data=False)  # raises on anything the engine refuses
    assert cfg.parallel.world_size == gpus and cfg.global_batch == batch
    top = best(capsys, "--model", model, "--gpus", str(gpus), "--global-batch", str(batch))
    assert (cfg.zero, cfg.recompute, cfg.parallel.pp) == (
        top["layout"]["zero"],
        top["layout"]["recompute"],
        top["layout"]["pp"],
    )


@pytest.mark.parametrize(
    "argv,match",
    [
        (
            ["--model", "gpt5", "--gpus", "8", "--global-batch", "8"],
            "unknown --model 'gpt5': give a preset",
        ),
        (
            ["--model", "tiny", "--gpu", "tpu-v4", "--gpus", "8", "--global-batch", "8"],
            "unknown GPU 'tpu-v4'",
        ),
        (
            ["--model", "tiny", "--gpus", "0", "--global-batch", "8"],
            "--gpus must be a positive integer, got 0",
        ),
        (
            ["--model", "tiny", "--gpus", "8", "--global-batch", "-4"],
            "--global-batch must be a positive integer",
        ),
        (
            ["--model", "tiny", "--gpus", "8", "--global-batch", "8", "--layout", "dp=2,tp=2,pp=1"],
            "dp×tp×pp×cp = 4 but --gpus is 8",
        ),
        (
            ["--layers", "4", "--gpus", "8", "--global-batch", "8"],
            "missing --hidden --heads --vocab --seq",
        ),
        (
            ["--model", "llama2-70b", "--gpus", "8", "--global-batch", "64", "--offload", "none"],
            "fits no layout on 8 × A100 80GB",
        ),
        (  # recomputation ruled out: the refusal says what it would do
            [
                "--model",
                "llama2-70b",
                "--gpus",
                "8",
                "--global-batch",
                "64",
                "--offload",
                "none",
                "--recompute",
                "none",
            ],
            "use --recompute full (blocks keep only their input)",
        ),
        (
            ["--model", "tiny", "--gpus", "8", "--global-batch", "8", "--attention", "paged"],
            "unknown --attention 'paged': choose one of fused, fused-v1, fused-triton, fused-v3, unfused",
        ),
        (
            ["--model", "tiny", "--gpus", "8", "--global-batch", "8", "--activations", "te"],
            "unknown --activations 'te': choose one of paracube, megatron",
        ),
        (
            ["--model", "tiny", "--gpus", "8", "--global-batch", "8", "--layout", "cp=3"],
            "--layout cp=3 does not divide --gpus 8",
        ),
        (  # context parallelism is planned, never emitted as a paracube train command
            ["--model", "tiny", "--gpus", "8", "--global-batch", "8", "--layout", "cp=2"]
            + ["--emit", "torchrun"],
            "paracube train does not run context parallelism",
        ),
    ],
)
def test_bad_input(capsys, argv, match):
    assert match in error(capsys, *argv)


def test_software_options_describe_the_run(capsys):
    """--attention, --no-sequence-parallel and --no-overlap-grad-reduce fix what the planner
    assumes about the training software (as for a published Megatron-LM 2021 run)."""
    argv = [
        "--model",
        "gpt3-13b",
        "--gpus",
        "64",
        "--global-batch",
        "512",
        "--layout",
        "dp=8,tp=8,pp=1",
        "--recompute",
        "full",
    ]
    modern = best(capsys, *argv)
    old = best(
        capsys,
        *argv,
        "--attention",
        "unfused",
        "--no-sequence-parallel",
        "--no-overlap-grad-reduce",
    )
    assert modern["layout"]["sequence_parallel"] and modern["layout"]["attention"] == "fused"
    assert not old["layout"]["sequence_parallel"] and old["layout"]["attention"] == "unfused"
    assert old["time"]["dp_exposed"] > modern["time"]["dp_exposed"]
    assert old["time"]["step_time"] > modern["time"]["step_time"]
    assert (
        modern["time"]["hardware_tflops_per_gpu"] > modern["time"]["tflops_per_gpu"]
    )  # recompute counted


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "resnet50", "--gpus", "8", "--gpu", "v100", "--global-batch", "2048"],
        ["--model", "gpt3-13b", "--gpus", "16", "--global-batch", "128", "--recompute", "full"],
    ],
)
def test_json_carries_mfu_hfu_and_the_ceiling_consistently(capsys, argv):
    """--json gives each candidate's MFU with the ceiling --explain states it against, and its
    executed FLOP rate: MFU ≤ ceiling ≤ 1, and the executed rate never below the model's
    (ResNet-50's was 0: a figure the generic planner never filled in)."""
    import json

    out = json.loads(plan(capsys, *argv, "--top", "5", "--json"))
    for cand in out["candidates"]:
        t = cand["time"]
        assert 0 < t["mfu"] <= t["mfu_ceiling"] + 1e-12 <= 1.0, t
        assert t["hardware_tflops_per_gpu"] >= t["tflops_per_gpu"] - 1e-9 > 0, t


def test_a_stack_states_its_software_at_once(capsys):
    """--stack megatron-core is the seven facts the README's NeMo example spells out (the same
    plan to the byte); a flag of its own overrides the stack's (here the pipeline split);
    --stack paracube is the default; the software owner is paracube.planner.stacks."""
    from paracube.planner.stacks import MEGATRON_CORE

    argv = ["--model", "llama3-70b", "--gpus", "64", "--gpu", "h100", "--global-batch", "128",
            "--precision", "fp8", "--layout", "dp=2,tp=4,pp=4,cp=2", "--chunks", "5",
            "--micro-batch", "1", "--schedule", "interleaved-1f1b", "--zero", "1"]  # fmt: skip
    flags = ["--activations", "megatron", "--loss", "fused", "--grad-accumulation", "fused",
             "--pipeline-split", "even", "--recompute-replay", "whole",
             "--grad-sync", "reduce-scatter", "--recompute-scope", "stage",
             "--grad-bucket", "megatron"]  # fmt: skip
    facts = ("activations", "loss", "grad_accumulation", "grad_sync", "grad_bucket")
    assert {k: MEGATRON_CORE[k] for k in facts} == {
        "activations": "megatron", "loss": "fused", "grad_accumulation": "fused",
        "grad_sync": "reduce-scatter", "grad_bucket": "megatron",
    }  # fmt: skip
    stated = best(capsys, *argv, "--stack", "megatron-core")
    spelt = best(capsys, *argv, *flags)
    # the plan itself to the byte; its speed-up differs, as its baseline on fewer GPUs is
    # searched over what Megatron-Core runs (no zero-bubble schedule), the flags' over all
    plan_of = ("layout", "memory", "time")
    assert {k: stated[k] for k in plan_of} == {k: spelt[k] for k in plan_of}
    assert stated["layout"]["split"] == "even" and stated["layout"]["activations"] == "megatron"
    overridden = best(capsys, *argv, "--stack", "megatron-core", "--pipeline-split", "engine")
    assert overridden["layout"]["split"] == "engine"
    assert overridden["layout"]["activations"] == "megatron"
    assert best(capsys, *argv, "--stack", "paracube") == best(capsys, *argv)
    composer = best(capsys, "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "64",
                    "--zero", "3", "--stack", "composer")  # fmt: skip
    assert composer["layout"]["backward_prefetch"] is False
    assert composer["layout"]["grad_accumulation"] == "side-stream"
    from paracube.planner.stacks import stack

    assert stack("nemo") == {**MEGATRON_CORE, "tp_comm_overlap": True} == stack("megatron-bridge")
    assert "fp8, as nemo runs it;" in plan(capsys, *argv, "--stack", "nemo").splitlines()[0]


def test_grad_reduce_is_part_of_the_software(capsys):
    """--grad-reduce compute halves the gradient bytes the reduction moves and each GPU
    holds, the launch command carries it, and the speed-up's baseline runs it too."""
    argv = [
        "--model",
        "gpt3-1.3b",
        "--gpus",
        "64",
        "--global-batch",
        "512",
        "--layout",
        "dp=64,tp=1,pp=1",
        "--micro-batch",
        "8",
        "--zero",
        "0",
        "--no-overlap-grad-reduce",
    ]
    fp32, compute = best(capsys, *argv), best(capsys, *argv, "--grad-reduce", "compute")
    # half the bytes; the ring's 2(dp − 1) latency steps stay: of each pass's 63 steps over
    # 8 nodes of 8, the 7 between nodes at InfiniBand's latency, the 56 others at NVLink's
    latency = 2 * (7 * interconnect("ib-hdr").latency + 56 * interconnect("nvlink3").latency)
    assert 2 * compute["time"]["dp_exposed"] - fp32["time"]["dp_exposed"] == pytest.approx(latency)
    assert compute["memory"]["model_states"] < fp32["memory"]["model_states"]
    assert compute["layout"]["grad_reduce"] == "compute"
    runs = [a for a in argv if a != "--no-overlap-grad-reduce"]  # paracube train overlaps
    assert "--grad-reduce compute" in plan(
        capsys, *runs, "--grad-reduce", "compute", "--emit", "torchrun"
    )


def test_backward_prefetch_is_part_of_the_software(capsys):
    """--no-backward-prefetch (FSDP1's BACKWARD_POST) leaves ZeRO-3's backward gathers
    exposed: the same layout plans slower, for a transformer and for a model described
    without layers alike, and the layout says which software it planned."""
    for model, batch in (("gpt3-1.3b", "64"), ("resnet50", "256")):
        argv = ["--model", model, "--gpus", "16", "--global-batch", batch, "--zero", "3"]
        argv += ["--micro-batch", "4"]
        pre, post = best(capsys, *argv), best(capsys, *argv, "--no-backward-prefetch")
        assert post["time"]["dp_exposed"] > pre["time"]["dp_exposed"]
        assert post["time"]["step_time"] > pre["time"]["step_time"]
        assert (pre["layout"]["backward_prefetch"], post["layout"]["backward_prefetch"]) == (
            True,
            False,
        )
    explained = plan(capsys, "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "64",
                     "--zero", "3", "--layout", "dp=16,tp=1,pp=1", "--no-backward-prefetch",
                     "--explain")  # fmt: skip
    assert "every backward waits for its own gathers" in explained


def test_fits_nothing_says_by_how_much_and_what_would_fit(capsys):
    """By how much, and the fewest GPUs (whole nodes) that hold the model under the same
    choices, with the layout found there: one node fewer does not."""
    import re

    argv = ["--model", "llama2-70b", "--gpus", "8", "--global-batch", "64"]
    err = error(capsys, *argv, "--offload", "none")
    assert "per GPU" in err and "× the 85 GB" in err  # 80 GiB
    # the choice without which it fits is named first: the search would offload
    assert "with --offload none" in err
    assert re.search(r"drop --offload none \(without it: [^)]*offload\)", err), err
    found = re.search(r"use (\d+) GPUs or more \(\1 hold it as ([^)]+)\)", err)
    assert found, err
    n, layout = int(found[1]), found[2]
    fewest = ["--model", "llama2-70b", "--global-batch", "64", "--offload", "none", "--top", "1"]
    assert f"| 1 | {layout} |" in plan(capsys, *fewest, "--gpus", str(n))
    assert "fits no layout" in error(capsys, *fewest, "--gpus", str(n - 8))
    # with the optimizer in host memory (105 GB a GPU of its 128 GB share of a DGX A100's
    # 1 TB) it fits: the search offers that unless --offload none
    assert "offload" in plan(capsys, *argv)
    err = error(capsys, "--model", "llama2-70b", "--gpus", "4", "--global-batch", "64")
    assert "fits no layout on 4 × A100 80GB" in err  # 210 GB a GPU to offload: over 128


def test_fits_nothing_names_the_choice_without_which_it_fits(capsys):
    """A shaping choice of the user's that rules out every layout that fits is named, with
    the layout found without it — here --chunks 7 on 1,000 A100 40GB: interleaving needs a
    pipeline, Megatron-Bridge runs ZeRO-3 only without one, and 1,000 = 8 × 125 leaves model
    parallelism at most 8 (96 blocks split by no factor of 125), too little for GPT-3 175B's
    weights and fp32 gradients; without it ZeRO-3 over the 1,000 fits. The layout named is
    the one the search ranks first without the choice."""
    import re

    argv = ["--model", "gpt3-175b", "--gpu", "a100-40gb", "--gpus", "1000"]
    argv += ["--global-batch", "12000", "--stack", "megatron-bridge"]
    err = error(capsys, *argv, "--chunks", "7")
    assert "fits no layout on 1000 × A100 40GB with --chunks 7" in err, err
    named = re.search(r"drop --chunks 7 \(without it: ([^)]+)\)", err)
    assert named, err
    assert f"| 1 | {named[1]} |" in plan(capsys, *argv, "--top", "1")
    # a switch: a mixture under tensor parallelism needs sequence parallelism (Megatron-Core),
    # so --no-sequence-parallel leaves this one data parallel, where it does not fit
    moe = ["--layers", "2", "--hidden", "1000", "--heads", "40", "--vocab", "151936", "--seq",
           "32768", "--kv-heads", "4", "--experts", "8", "--experts-per-token", "1", "--gpu",
           "a100-40gb", "--gpus", "1000", "--global-batch", "3000"]  # fmt: skip
    err = error(capsys, *moe, "--no-sequence-parallel")
    assert (
        "with --no-sequence-parallel" in err and "drop --no-sequence-parallel (without it:" in err
    )


def test_generic_model_is_planned_data_parallel(capsys):
    """A non-transformer (ResNet-50: parameters, FLOPs and activations per sample)."""
    cand = best(capsys, "--model", "resnet50", "--gpus", "8", "--global-batch", "2048")
    assert (cand["layout"]["dp"], cand["layout"]["tp"], cand["layout"]["pp"]) == (8, 1, 1)
    assert cand["layout"]["micro_batch"] == 256 and cand["memory"]["total"] < 80e9
    assert "data parallelism only" in error(
        capsys,
        "--model",
        "resnet50",
        "--gpus",
        "8",
        "--global-batch",
        "64",
        "--layout",
        "dp=4,tp=2,pp=1",
    )


def test_every_candidate_shows_its_speed_up_and_the_explanation_states_it(capsys):
    """The guide's Q2: gpt3-1.3b on 4 A100s — every row's speed-up over one GPU (same
    global batch) is at least 3.6×, and above 4× only by a few percent (ZeRO's freed memory
    lets a 16-sequence micro-batch run where one GPU holds 8: larger GEMMs); --explain
    states the best one's in the guide's form, N / (1 + overhead ÷ ideal)."""
    import re

    out = plan(capsys, "--model", "gpt3-1.3b", "--gpus", "4", "--global-batch", "256", "--explain")
    assert "speed-up vs 1 GPU (efficiency)" in out
    rows = [line for line in out.splitlines() if re.match(r"\| \d+ \|", line)]
    speedups = [float(re.search(r"\| ([\d.]+)× \(\d+%\) \|$", r).group(1)) for r in rows]
    assert speedups and all(3.6 <= s <= 4.0 * 1.05 for s in speedups)
    assert "Speed-up over 1 GPU" in out and "N / (1 + overhead ÷ ideal) with N = 4" in out


def test_the_speed_up_baseline_runs_the_same_software(capsys):
    """A fixed attention kernel describes the software, not the layout: the one-GPU
    baseline runs it too, so a slower kernel does not show as lost scaling (gpt3-1.3b on
    8 H100s, data parallel: the same speed-up with FlashAttention-2 or in Triton, within
    0.02 — if anything higher in Triton, whose slower compute hides the same communication)."""
    import re

    def speedup(*extra: str) -> float:
        out = plan(capsys, "--model", "gpt3-1.3b", "--gpus", "8", "--gpu", "h100",
                   "--global-batch", "64", "--top", "1", *extra)  # fmt: skip
        row = next(line for line in out.splitlines() if line.startswith("| 1 |"))
        return float(re.search(r"\| ([\d.]+)× \(\d+%\) \|$", row).group(1))

    flash2, triton = speedup(), speedup("--attention", "fused-triton")
    assert 0.0 <= triton - flash2 <= 0.02 + 1e-9  # the printed speed-ups' two decimals


def test_a_model_too_large_for_one_gpu_is_measured_against_one_node(capsys):
    """gpt3-13b does not fit one A100-80GB: speed-ups over one 8-GPU node."""
    out = plan(capsys, "--model", "gpt3-13b", "--gpus", "32", "--global-batch", "256")
    assert "speed-up vs 8 GPUs (efficiency)" in out


def test_resnet50_explains_its_speed_up(capsys):
    out = plan(capsys, "--model", "resnet50", "--gpus", "8", "--gpu", "v100", "--global-batch", "256",
               "--precision", "fp16", "--explain")  # fmt: skip
    assert "Speed-up over 1 GPU" in out


def test_a_model_without_layers_says_why_it_shards(capsys):
    """ResNet-50 ranked under ZeRO says why, as a transformer's plan does
    (reasons.without_zero_text): the replicated twin fits, at the step it would take, and the
    part ZeRO shortens most — the Adam step, split 8 ways — each figure the planner's own."""
    import re

    argv = ["--model", "resnet50", "--gpus", "8", "--gpu", "v100", "--global-batch", "256"]
    chosen = best(capsys, *argv)["layout"]
    assert chosen["zero"] > 0
    out = plan(capsys, *argv, "--explain")
    found = re.search(r"- ZeRO-(\d) shards .+ over the 8 GPUs; .+ Without ZeRO it fits too "
                      r"\([\d.]+ GB\) at ([\d.,]+ m?s) a step against ([\d.,]+ m?s): it is "
                      r"sharded for speed, most of it in the optimizer step \(([\d.]+ m?s) "
                      r"shorter\)", out)  # fmt: skip
    assert found, out
    assert int(found[1]) == chosen["zero"]
    fixed = ["--layout", "dp=8", "--micro-batch", str(chosen["micro_batch"])]
    plain = best(capsys, *argv, *fixed, "--zero", "0")["time"]
    sharded = best(capsys, *argv, *fixed, "--zero", str(chosen["zero"]))["time"]
    assert seconds(found[2]) == pytest.approx(plain["step_time"], rel=0.01)  # 3 digits
    assert seconds(found[3]) == pytest.approx(sharded["step_time"], rel=0.01)
    assert seconds(found[4]) == pytest.approx(plain["optimizer"] - sharded["optimizer"], rel=0.01)


def test_the_scaling_sentence_names_what_the_overhead_is(capsys):
    """ResNet-50 on 8 V100s: the sentence names the part of the step that costs most beyond
    its share of the one-GPU baseline's, with those seconds — derived here from the plan's
    own parts (report.step_parts) of the best layout and of the baseline — never
    "data-parallel communication (0 s)"."""
    import re

    argv = ["--model", "resnet50", "--gpus", "8", "--gpu", "v100", "--global-batch", "256"]
    out = plan(capsys, *argv, "--explain")
    found = re.search(r"and ([\d.]+ m?s) beyond it; of the step's overheads the largest is "
                      r"(.+?) \(([\d.]+ m?s)\)\.", out)  # fmt: skip
    assert found, out
    beyond, name, named = seconds(found[1]), found[2], seconds(found[3])
    data = json.loads(plan(capsys, *argv, "--json"))
    top, base = data["candidates"][0]["time"], data["baseline"]["layout"]
    one = best(capsys, *argv[:2], "--gpus", "1", *argv[4:6], "--global-batch", "256",
               "--layout", "dp=1", "--micro-batch", str(base["micro_batch"]),
               "--zero", "0")["time"]  # fmt: skip
    assert one["step_time"] == pytest.approx(data["baseline"]["step_time"])  # the baseline
    words = {"compute": "the compute beyond the baseline's share", "dp_exposed":
             "data-parallel communication", "optimizer": "the optimizer step"}  # fmt: skip
    beyond_share = {k: top[k] - one[k] / 8 for k in words}
    worst = max(beyond_share, key=beyond_share.__getitem__)
    assert name.startswith(words[worst]), name
    assert named == pytest.approx(beyond_share[worst], rel=0.01)  # printed to 3 digits
    assert 0 < named <= beyond


def test_the_scaling_sentence_names_the_unsplit_optimizer_when_it_costs_most(capsys):
    """ResNet-50 on 8 V100s at 256 images a GPU, plain data parallelism: the step's compute
    is the baseline's split 8 ways to 0.1 %, and the largest part of what it takes beyond the
    ideal is the Adam step every replica runs over the whole model — 7/8 of it beyond the
    baseline's share. The sentence named "the compute beyond the baseline's share" with an
    eighth of the overhead's seconds; it names the optimizer step, with those seconds."""
    import re

    argv = ["--model", "resnet50", "--gpus", "8", "--gpu", "v100", "--global-batch", "2048"]
    out = plan(capsys, *argv, "--explain")
    assert "| 1 | dp=8 tp=1 pp=1 b=256 m=1 |" in out  # plain data parallelism, no ZeRO
    found = re.search(r"and ([\d.]+ m?s) beyond it; of the step's overheads the largest is "
                      r"the optimizer step, which every data-parallel replica runs whole "
                      r"\(ZeRO-1 splits it\) \(([\d.]+ m?s)\)", out)  # fmt: skip
    assert found, out
    beyond, named = (seconds(g) for g in found.groups())
    best = json.loads(plan(capsys, *argv, "--json"))["candidates"][0]["time"]
    assert named == pytest.approx(7 / 8 * best["optimizer"], rel=0.01)  # printed to 3 digits
    assert named <= beyond


def test_a_baseline_is_said_to_pay_what_it_pays_beyond_n_times_the_faster_layout():
    """Below the ideal, the sentence names what the baseline pays to fit that the layout on
    N times the GPUs does not: the part furthest beyond N × the same part of the faster
    step — an offloaded optimizer step — not the baseline's largest overhead, which can be a
    part both pay alike (all-to-alls over twice the blocks on half the GPUs: 4.2 s against
    2 × 2.1 s)."""
    from paracube.planner.report import baseline_cost
    from paracube.planner.search import Candidate
    from paracube.planner.time_model import StepEstimate

    def step(compute, optimizer, ep_comm):
        return StepEstimate(compute=compute, recompute=0.0, tp_comm=0.0, pp_comm=0.0,
                            bubble=0.0, dp_exposed=0.0, optimizer=optimizer, tokens_per_s=1.0,
                            tflops_per_gpu=1.0, mfu=0.1, ep_comm=ep_comm)  # fmt: skip

    baseline = Candidate(layout=None, memory=None, time=step(16.0, 3.0, 4.2))  # type: ignore[arg-type]
    faster = step(8.0, 0.1, 2.1)
    text = baseline_cost(baseline, faster, 2)
    assert text.startswith("the optimizer step: 2.8 s beyond 2 × this layout's"), text
    text = baseline_cost(baseline, step(6.0, 1.5, 2.1), 2)  # compute: 4 s beyond 2 × 6
    assert text.startswith("compute beyond the faster layout's × N"), text


def test_a_more_than_linear_speed_up_names_a_real_overhead(capsys):
    """Llama 3 70B on 64 H100s against one node that must offload and recompute every
    block to fit: the step is below the ideal, so no part costs more than its share — the
    sentence names the layout's own largest overhead with its seconds, not a part at 0 s."""
    import re

    out = plan(capsys, "--model", "llama3-70b", "--gpus", "64", "--gpu", "h100",
               "--global-batch", "512", "--explain")  # fmt: skip
    line = next(line for line in out.splitlines() if line.startswith("- Speed-up over 8 GPUs"))
    assert "below it — more than linear" in line, line
    seconds = float(re.search(r"the largest is [^(]+\(([\d.e-]+) s\)\.$", line).group(1))
    assert seconds > 1.0, line


def test_the_data_parallel_line_says_what_crosses_the_network_under_each_zero_stage(capsys):
    """--explain's first line for a data-parallel-only layout: under ZeRO-3 no GPU holds a
    replica (it said "every GPU holds a replica ... gradients once per step" beside a ZeRO-3
    line of per-micro-batch reduce-scatters); under ZeRO-2 with accumulation the gradients
    go in every micro-batch's backward; under ZeRO-1 once, and the parameters come back."""

    def first_line(*extra: str) -> str:
        out = plan(capsys, "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "512",
                   "--micro-batch", "16", "--layout", "dp=8,tp=1,pp=1", "--explain", *extra)  # fmt: skip
        return out.split("\nWhy ", 1)[1].splitlines()[1]

    zero3 = first_line("--zero", "3")
    assert "each GPU holds 1/8 of its states" in zero3 and "replica" not in zero3, zero3
    zero2 = first_line("--zero", "2")
    assert "in each of the 4 micro-batches' backwards" in zero2 and "once" not in zero2, zero2
    zero1 = first_line("--zero", "1")
    assert "once per step" in zero1 and "the updated parameters after the step" in zero1, zero1
    plain = first_line("--zero", "0")
    assert "only gradients cross" in plain and "parameters" not in plain, plain


def test_data_parallel_beside_model_parallel_shards_under_zero3(capsys):
    """Beside tensor parallelism, --explain said data parallelism "replicates this
    model-parallel group" under ZeRO-3 too; it shards its states over the copies."""

    def line(zero: str) -> str:
        out = plan(capsys, "--model", "gpt3-13b", "--gpus", "64", "--global-batch", "512",
                   "--layout", "dp=16,tp=4,pp=1", "--zero", zero, "--explain")  # fmt: skip
        return next(x for x in out.splitlines() if x.startswith("- Data parallel 16 over"))

    assert line("3").endswith(
        "shards this model-parallel group's states over its copies (ZeRO-3, above)."
    )
    assert line("1").endswith("replicates this model-parallel group.")


def test_explain_in_fp32_on_a_gpu_without_bf16_names_its_units(capsys):
    """--explain in fp32 on V100s stopped with "--precision bf16: V100 ... has no bfloat16
    tensor cores": its checkpointing trade-off was timed in bf16. It is timed in the plan's
    precision, and the prediction line names the units fp32 runs on."""
    out = plan(capsys, "--model", "gpt3-1.3b", "--gpus", "4", "--gpu", "v100",
               "--global-batch", "64", "--precision", "fp32", "--explain")  # fmt: skip
    assert "- Activation checkpointing here:" in out
    assert "The compute runs the FP32 units (CUDA cores) at the base clock" in out, out


def test_a_steps_parts_add_up_to_its_step_time():
    """The scaling sentence splits a step's overhead part by part (report.step_parts): the
    parts must be the whole step, for every candidate of a sweep of layouts."""
    from paracube.models.presets import preset
    from paracube.planner import hardware as hw
    from paracube.planner.report import step_parts
    from paracube.planner.search import search
    from paracube.planner.time_model import Cluster

    cluster = Cluster(hw.gpu("h100"), 8, hw.interconnect("nvlink4"), hw.interconnect("ib-ndr"))
    for name, gpus, batch in [
        ("gpt3-13b", 16, 512),
        ("llama3-70b", 32, 256),
        ("mixtral-8x7b", 16, 256),
    ]:
        ranked = search(preset(name), cluster, gpus, batch).ranked
        assert len(ranked) >= 20, name
        for cand in ranked:
            parts = step_parts(cand.time)
            assert sum(parts.values()) == pytest.approx(cand.time.step_time, rel=1e-12)


def test_the_checkpointing_tradeoff_is_for_every_block_whatever_the_layout_recomputes(capsys):
    """--explain's trade-off line compares checkpointing every block or none: a layout that
    recomputes its first 2 blocks had it say full recomputation saves 10 % (its 2 blocks);
    with unfused attention selective saves Korthikanti's ~70 % (§5: 34 of 34 + 5·a·s/h per
    s·b·h kept), full all but the checkpoints. With fused attention selective has no s×s
    scores to drop, and says so."""
    import re

    def tradeoff(*extra: str) -> str:
        out = plan(capsys, "--model", "gpt3-13b", "--gpus", "16", "--global-batch", "256",
                   "--layout", "dp=4,tp=2,pp=2", "--recompute", "full", "--recompute-blocks", "2",
                   "--explain", *extra)  # fmt: skip
        return next(line for line in out.splitlines() if "checkpointing here" in line)

    line = tradeoff("--attention", "unfused")
    selective, full = (int(x) for x in re.findall(r"cuts activation memory by (\d+)%", line))
    assert 60 <= selective <= 80 and full >= 90
    assert "selective recompute saves nothing here" in tradeoff()


def test_v100s_are_planned_in_fp16_unless_told(capsys):
    """V100's tensor cores take fp16, not bfloat16: without --precision a V100 job (or a
    mixed cluster with V100s) is planned in fp16, at the tensor cores' rate; bf16 asked for
    is refused (a bad-input row), never timed at a rate the GPU does not have."""
    out = plan(capsys, "--model", "gpt3-1.3b", "--gpus", "8", "--gpu", "v100", "--global-batch", "64",
               "--top", "1")  # fmt: skip
    assert ", fp16;" in out.splitlines()[0]
    told = plan(capsys, "--model", "gpt3-1.3b", "--gpus", "8", "--gpu", "v100", "--global-batch", "64",
                "--top", "1", "--precision", "fp16")  # fmt: skip
    assert told == out
    mixed = plan(capsys, "--model", "gpt3-1.3b", "--gpus", "8xa100-80gb,8xv100", "--global-batch",
                 "64", "--top", "1")  # fmt: skip
    assert ", fp16;" in mixed.splitlines()[0]
    assert ", bf16;" in plan(capsys, "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "64",
                             "--top", "1").splitlines()[0]  # fmt: skip


def test_fsdp2s_copy_out_is_explained_with_its_seconds(capsys):
    """--stack torchtitan (FSDP2) under ZeRO-3: --explain names the copy-out and its seconds,
    exactly the compute the same layout with flat units (--stack fsdp1) does not pay (its
    blocks planned fused, as fsdp1's are: torchtitan's eager ones cost more besides)."""
    import re

    argv = ["--model", "llama3-8b", "--gpus", "64", "--global-batch", "64",
            "--layout", "dp=64,tp=1,pp=1", "--zero", "3", "--elementwise", "fused"]  # fmt: skip
    out = plan(capsys, *argv, "--stack", "torchtitan", "--explain")
    said = float(re.search(r"\(FSDP2's per-parameter sharding\) adds ([\d.e-]+) s", out).group(1))
    fsdp2, fsdp1 = (best(capsys, *argv, "--stack", name) for name in ("torchtitan", "fsdp1"))
    assert fsdp2["layout"]["param_gather"] == "per-parameter"
    assert fsdp1["layout"]["param_gather"] == "flat"
    assert said == pytest.approx(fsdp2["time"]["compute"] - fsdp1["time"]["compute"], rel=2e-3)
    assert "per-parameter sharding" not in plan(capsys, *argv, "--stack", "fsdp1", "--explain")


def test_resnet50_time_to_train_on_one_and_eight_gpus(capsys):
    """The guide's ResNet-50 question: 90 ImageNet epochs in hours on 8 GPUs and on 1; the
    hours are the images over the predicted images/s, and their ratio is the speed-up."""
    import re

    out = plan(capsys, "--model", "resnet50", "--gpus", "8", "--gpu", "v100", "--global-batch", "256",
               "--precision", "fp16", "--epochs", "90", "--json")  # fmt: skip
    best_rate = json.loads(out)["candidates"][0]["time"]["tokens_per_s"]
    text = plan(capsys, "--model", "resnet50", "--gpus", "8", "--gpu", "v100", "--global-batch", "256",
                "--precision", "fp16", "--epochs", "90")  # fmt: skip
    found = re.search(
        r"1,281,167 samples: ([\d.,]+) h on 8 GPUs .* against ([\d.,]+) h on 1 GPU", text
    )
    eight, one = (float(g.replace(",", "")) for g in found.groups())
    assert eight == pytest.approx(90 * 1_281_167 / best_rate / 3600, rel=0.01)
    assert 1 < one / eight <= 8.05


def test_a_resnet50_plan_says_what_nvidias_measured_runs_say_of_it(capsys):
    """A ResNet-50 plan prints the planner's images/s against NVIDIA's measured runs on the
    same kind of units — on tensor cores the range it is optimistic by, and on a GPU and
    precision NVIDIA ran, those runs' images/s beside this plan's; in fp32 its CUDA-core
    range. Every figure is published.resnet50_checks' (the bench's rows)."""
    from paracube.planner.published import resnet50_checks

    tf32 = plan(capsys, "--model", "resnet50", "--gpus", "8", "--gpu", "a100-80gb",
                "--global-batch", "2048", "--precision", "tf32", "--top", "1")  # fmt: skip
    tensor = resnet50_checks(tensor_cores=True)
    low, high = min(r["ratio"] for r in tensor), max(r["ratio"] for r in tensor)
    assert high > 1.2  # the gap this line exists to state
    assert f"on tensor cores (fp16, tf32) this model gives {low:.2f}–{high:.2f}×" in tf32
    runs = [r for r in tensor if r["gpu"] == "a100-80gb" and r["precision"] == "tf32"]
    one, eight = sorted(runs, key=lambda r: r["gpus"])
    assert (
        f"{one['published']:,} images/s on 1 and {eight['published']:,} on 8 GPUs, against "
        f"{one['predicted']:,} and {eight['predicted']:,} here" in tf32
    )
    fp32 = plan(capsys, "--model", "resnet50", "--gpus", "8", "--gpu", "h100",
                "--global-batch", "256", "--precision", "fp32", "--top", "1")  # fmt: skip
    cuda = resnet50_checks(tensor_cores=False)
    low, high = min(r["ratio"] for r in cuda), max(r["ratio"] for r in cuda)
    assert f"on CUDA cores (fp32) this model gives {low:.2f}–{high:.2f}×" in fp32
    assert "images per GPU" not in fp32  # NVIDIA's fp32 runs are on V100s, not H100s
    gpt = plan(capsys, "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "64", "--top", "1")
    assert "NVIDIA's measured ResNet-50" not in gpt


def test_a_token_budget_is_its_time_to_train_on_the_best_layout_and_the_baseline(capsys):
    """--train-tokens: the budget over each layout's predicted tokens/s (the --json figures),
    in hours, with days past two; the two times' ratio is the speed-up column's."""
    import re

    argv = ["--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "64", "--top", "1"]
    out = json.loads(plan(capsys, *argv, "--json"))
    best, base = out["candidates"][0], out["baseline"]
    text = plan(capsys, *argv, "--train-tokens", "26B")
    found = re.search(
        r"Time to train 26B tokens: ([\d.,]+) h on 8 GPUs \(.*\), against ([\d.,]+) h "
        r"\(([\d.,]+) days\) on 1 GPU \(([\d.]+)× faster\)\.",
        text,
    )
    assert found, text
    eight, one, days, faster = (float(g.replace(",", "")) for g in found.groups())
    assert eight == pytest.approx(26e9 / best["time"]["tokens_per_s"] / 3600, rel=1e-3)
    assert one == pytest.approx(26e9 / base["tokens_per_s"] / 3600, rel=1e-3)
    assert days == pytest.approx(one / 24, abs=0.05) and one >= 48 > eight
    assert faster == pytest.approx(best["speedup"], abs=0.005)
    timed = json.loads(plan(capsys, *argv, "--train-tokens", "26B", "--json"))["time_to_train"]
    assert timed["tokens"] == 26e9
    assert timed["seconds"] / 3600 == pytest.approx(eight, rel=1e-3)
    assert timed["baseline_seconds"] / 3600 == pytest.approx(one, rel=1e-3)
    assert out["time_to_train"] is None  # no budget asked for


@pytest.mark.parametrize(
    ("text", "tokens"), [("2e12", 2e12), ("300B", 3e11), ("15T", 1.5e13), ("1.5m", 1.5e6)]
)
def test_a_token_budget_is_read_with_its_suffix(text, tokens):
    from paracube.cli.plan_budget import token_count, tokens_text

    assert token_count(text) == pytest.approx(tokens)
    assert token_count(tokens_text(tokens)) == pytest.approx(tokens)


def test_epochs_of_a_model_without_a_dataset_size_needs_it(capsys):
    err = error(
        capsys, "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "64", "--epochs", "1"
    )
    assert "--epochs 1: needs --train-samples N" in err


def test_a_context_parallel_layout_is_evaluated(capsys):
    """--layout cp=2 (Megatron-Core's context parallelism): every candidate holds it, on the
    GPUs it was given, and says so."""
    argv = ["--model", "llama3-8b", "--gpus", "16", "--gpu", "h100", "--global-batch", "32"]
    out = plan(capsys, *argv, "--layout", "cp=2", "--explain")
    assert "cp=2" in out and "Context parallel 2 gives each rank 4096" in out
    top = best(capsys, *argv, "--layout", "dp=4,tp=2,cp=2")
    assert (top["layout"]["cp"], top["layout"]["dp"], top["layout"]["tp"]) == (2, 4, 2)
    assert top["time"]["cp_comm"] > 0


def test_fp8_is_planned_on_hopper_and_never_emitted(capsys):
    argv = ["--model", "llama3-8b", "--gpus", "8", "--global-batch", "64"]
    fp8 = best(capsys, *argv, "--gpu", "h100", "--precision", "fp8")
    bf16 = best(capsys, *argv, "--gpu", "h100", "--precision", "bf16")
    assert fp8["time"]["step_time"] < bf16["time"]["step_time"]
    told = plan(capsys, *argv, "--gpu", "h100", "--precision", "fp8", "--explain")
    assert "Under fp8 the blocks' linear layers run on the FP8 units (1,979 TFLOP/s" in told
    assert "A100 80GB has no FP8 tensor cores" in error(capsys, *argv, "--precision", "fp8")
    emitted = error(capsys, *argv, "--gpu", "h100", "--precision", "fp8", "--emit", "torchrun")
    assert "paracube train runs fp32, bf16, fp16" in emitted


def test_tp_comm_overlap_describes_megatron_cores_userbuffers(capsys):
    argv = ["--model", "llama3-70b", "--gpus", "16", "--gpu", "h100", "--global-batch", "32"]
    argv += ["--layout", "dp=1,tp=8,pp=2"]
    waited = best(capsys, *argv)
    hidden = best(capsys, *argv, "--tp-comm-overlap")
    assert hidden["layout"]["tp_comm_overlap"] and not waited["layout"]["tp_comm_overlap"]
    assert 0 < hidden["time"]["tp_comm"] < waited["time"]["tp_comm"]


def test_a_presets_sequence_length_is_planned_and_emitted(capsys):
    """--seq with --model plans the preset at that sequence length (as train's --seq-len)
    and the emitted command carries it; its other shape flags are refused, not ignored."""
    import shlex

    from paracube.cli import build_parser, config_from_args

    out = plan(
        capsys,
        "--model",
        "llama2-7b",
        "--seq",
        "8192",
        "--gpus",
        "8",
        "--global-batch",
        "8",
        "--emit",
        "torchrun",
    )
    assert "global batch 8 × 8192 tokens" in out
    line = next(x for x in out.splitlines() if x.startswith("torchrun "))
    argv = shlex.split(line.split(" -m paracube ", 1)[1])
    cfg = config_from_args(build_parser().parse_args(argv))
    assert cfg.model.seq_len == 8192


def test_plan_reads_the_model_as_train_does(capsys):
    """--model takes what paracube train takes: a local Hugging Face config is planned with
    its own shape (llama-tiny: 4 layers, grouped-query attention, SwiGLU)."""
    from pathlib import Path

    tiny = Path(__file__).parent.parent / "examples" / "models" / "llama-tiny"
    out = plan(capsys, "--model", f"hf:{tiny}", "--gpus", "8", "--global-batch", "64",
               "--seq-len", "256", "--json")  # fmt: skip
    shape = json.loads(out)["shape"]
    assert shape["n_layers"] == 4 and shape["n_kv_heads"] == 2
    assert shape["activation"] == "swiglu" and shape["seq_len"] == 256


def test_a_hugging_face_config_is_planned_at_its_own_context(capsys, tmp_path):
    """Llama 3 8B's Hugging Face config, without --seq, is planned at its 8,192-token context
    exactly as the llama3-8b preset (train's default caps at 1,024 tokens to fit a CPU; it
    planned at 1,024 before), and the emitted command trains at that length."""
    config = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
              "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
              "vocab_size": 128256, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
              "tie_word_embeddings": False, "hidden_act": "silu"}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    cluster = ["--gpus", "8", "--gpu", "h100", "--global-batch", "64"]
    hf = best(capsys, "--model", f"hf:{tmp_path}", *cluster)
    named = best(capsys, "--model", "llama3-8b", *cluster)
    assert hf["layout"] == named["layout"] and hf["time"] == named["time"]
    line = plan(capsys, "--model", f"hf:{tmp_path}", *cluster, "--top", "1", "--emit", "torchrun")
    assert "--seq-len 8192" in line.strip().splitlines()[-1]


def test_a_custom_llama_shape_is_the_preset(capsys):
    """A custom shape with a LLaMA block (--activation swiglu --norm rmsnorm --position rope
    --no-bias) is planned exactly as the llama3-8b preset it spells out."""
    cluster = ["--gpus", "64", "--gpu", "h100", "--global-batch", "512"]
    shape = ["--layers", "32", "--hidden", "4096", "--heads", "32", "--kv-heads", "8",
             "--ffn", "14336", "--vocab", "128256", "--seq", "8192", "--activation", "swiglu",
             "--norm", "rmsnorm", "--position", "rope", "--no-bias"]  # fmt: skip
    custom, named = best(capsys, *shape, *cluster), best(capsys, "--model", "llama3-8b", *cluster)
    assert custom["layout"] == named["layout"] and custom["time"] == named["time"]


def test_loss_and_recompute_blocks_are_fixed_choices(capsys):
    """--loss fused and --recompute-blocks N reach the planned layout (the latter as a full
    recomputation of the first N blocks), and the fused loss needs less memory."""
    argv = ["--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "64",
            "--layout", "dp=8,tp=1,pp=1", "--micro-batch", "8", "--zero", "1"]  # fmt: skip
    torch_loss, fused = best(capsys, *argv), best(capsys, *argv, "--loss", "fused")
    assert fused["layout"]["loss"] == "fused" and torch_loss["layout"]["loss"] == "torch"
    assert fused["memory"]["total"] < torch_loss["memory"]["total"]
    three = best(capsys, *argv, "--recompute-blocks", "3")["layout"]
    assert (three["recompute"], three["recompute_blocks"]) == ("full", 3)


def test_a_megatron_stack_plans_metas_pipeline_of_126_blocks(capsys):
    """--stack megatron-core tries Megatron-Core's split that counts the embedding and the
    loss as blocks (stacks.STACK_SPLITS), so Llama 3 405B at Meta's TP 8 × PP 16 plans; a
    --pipeline-split the user gives is the one planned, and here it cannot be made."""
    argv = ["--model", "llama3-405b", "--gpus", "16384", "--gpu", "h100", "--global-batch",
            "2048", "--stack", "megatron-core", "--layout", "dp=128,tp=8,pp=16"]  # fmt: skip
    assert best(capsys, *argv)["layout"]["split"] == "even-ends"
    err = error(capsys, *argv, "--pipeline-split", "even")
    assert "--pipeline-split even: the layers do not divide into pp × chunks" in err


def test_a_stack_is_planned_only_with_what_it_runs(capsys):
    """A plan for a stack proposes only layouts it can run (stacks.STACK_CHOICES): Megatron's
    1F1B or interleaved schedule (never zero-bubble) and ZeRO 0, 1 or 3 (its distributed
    optimizer or FSDP, never ZeRO-2), Megatron-LM 2021 without ZeRO or
    selective recomputation, Composer's FSDP alone (tp = pp = 1, ZeRO 0/2/3, whole blocks
    checkpointed); the one-GPU baseline runs the same stack."""
    from paracube.planner.stacks import MEGATRON_SCHEDULES

    pipelined = ["--model", "gpt3-13b", "--gpus", "64", "--global-batch", "512", "--json",
                 "--top", "50"]  # fmt: skip
    plain = json.loads(plan(capsys, *pipelined))["candidates"]
    assert any(c["layout"]["schedule"] == "zb-h1" for c in plain)  # what paracube runs
    for name in ("megatron-core", "megatron-lm-2021"):
        layouts = [
            c["layout"] for c in json.loads(plan(capsys, *pipelined, "--stack", name))["candidates"]
        ]
        assert layouts and all(L["schedule"] in MEGATRON_SCHEDULES for L in layouts)
        assert any(L["pp"] > 1 for L in layouts) and all(L["zero"] != 2 for L in layouts)
    assert any(c["layout"]["zero"] == 2 for c in plain)  # paracube's engine runs ZeRO-2
    # Megatron-Core offloads its distributed optimizer's states only (ZeRO-1, or over a
    # single data-parallel rank any stage: the same optimizer)
    tight = ["--model", "llama2-70b", "--gpus", "8", "--global-batch", "32", "--json",
             "--top", "50"]  # fmt: skip
    ours = [c["layout"] for c in json.loads(plan(capsys, *tight))["candidates"]]
    assert any(L["offload"] and L["zero"] != 1 for L in ours)
    megatron = [
        c["layout"]
        for c in json.loads(plan(capsys, *tight, "--stack", "megatron-core"))["candidates"]
    ]
    assert any(L["offload"] for L in megatron)
    assert all(L["zero"] == 1 or L["dp"] * L["cp"] == 1 for L in megatron if L["offload"])
    assert any(L["offload"] and L["dp"] * L["cp"] > 1 for L in ours)
    old = [
        c["layout"]
        for c in json.loads(plan(capsys, *pipelined, "--stack", "megatron-lm-2021"))["candidates"]
    ]
    assert all(L["zero"] == 0 and L["recompute"] in ("none", "full") for L in old)
    composer = json.loads(plan(capsys, "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch",
                               "64", "--stack", "composer", "--json", "--top", "50"))  # fmt: skip
    assert all(
        (c["layout"]["tp"], c["layout"]["pp"]) == (1, 1)
        and c["layout"]["zero"] in (0, 2, 3)
        and c["layout"]["recompute"] in ("none", "full")
        for c in composer["candidates"]
    )


def test_nemos_recipes_are_what_the_planner_chooses_for_nemo(capsys):
    """Asked which layout NeMo should run, the search — context parallelism included, as
    NeMo runs it — lands on NVIDIA's own recipes (NVIDIA/dgxc-benchmarking, llama3.1/
    README_70b.md and README_405b.md): 405B on 576 H100s at TP 8 × PP 9 × CP 2 first —
    with 14 virtual stages, as NVIDIA's 7 is as fast (within 1 %) but at the memory edge,
    where a layout with room ranks first; Llama 3.1 70B on 64 at TP 4 × PP 4 × CP 2,
    interleaved, in the tier the planner cannot tell from its best (within the 1 % it ranks
    by: search.rank) — the first of that tier, by simplicity, is TP 8 × PP 2. paracube's own
    plan proposes no context parallelism (its engine does not run it)."""
    from paracube.planner import hardware as hw
    from paracube.planner.search import at_memory_edge, context_parallel_sizes

    h100 = ["--gpu", "h100", "--json", "--top", "3"]
    l70 = ["--model", "llama3-70b", "--gpus", "64", "--global-batch", "128", "--gpu", "h100",
           "--json", "--top", "20", "--stack", "nemo"]  # fmt: skip
    ranked = json.loads(plan(capsys, *l70))["candidates"]
    best_rate = max(c["time"]["tokens_per_s"] for c in ranked)
    recipes = [
        c for c in ranked
        if (c["layout"]["tp"], c["layout"]["pp"], c["layout"]["cp"], c["layout"]["schedule"])
        == (4, 4, 2, "interleaved-1f1b")
    ]  # fmt: skip
    assert recipes and recipes[0]["time"]["tokens_per_s"] >= 0.99 * best_rate
    l405 = ["--model", "llama3-405b", "--gpus", "576", "--global-batch", "252", *h100]
    ranked = json.loads(plan(capsys, *l405, "--stack", "nemo"))["candidates"]
    first = ranked[0]["layout"]
    assert (first["tp"], first["pp"], first["cp"]) == (8, 9, 2)
    vp7 = next(
        c for c in ranked if (c["layout"]["tp"], c["layout"]["pp"], c["layout"]["cp"],
                              c["layout"]["chunks"]) == (8, 9, 2, 7)
    )  # fmt: skip
    assert vp7["time"]["tokens_per_s"] <= 1.01 * ranked[0]["time"]["tokens_per_s"]
    capacity = hw.gpu("h100").memory_bytes
    assert at_memory_edge(vp7["memory"]["total"], capacity)
    assert not at_memory_edge(ranked[0]["memory"]["total"], capacity)
    l70_own = ["--model", "llama3-70b", "--gpus", "64", "--global-batch", "128", *h100]
    own = json.loads(plan(capsys, *l70_own))["candidates"]
    assert all(c["layout"]["cp"] == 1 for c in own)
    assert context_parallel_sizes(preset("llama3-70b"), 64) == [1, 2, 4, 8]  # chunks ≥ 512
    assert context_parallel_sizes(preset("gpt3-1.3b"), 64) == [1, 2]  # 2,048 tokens


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`paracube plan … | head -1`: the pipe closes under the output; the command stops
    quietly (status 141, as a process ended by SIGPIPE), with nothing on stderr."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "paracube", "plan", "--model", "llama3-70b", "--gpus", "64",
            "--gpu", "h100", "--global-batch", "128", "--stack", "nemo"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader leaves before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == "", err


def test_the_header_counts_every_layout_that_fits_not_only_those_kept(capsys):
    """The search keeps the fastest 50 × --top candidates; the header still counts every
    layout that fits (it said "150 fit" for --top 3 where 730 did), and with --explain's
    rejections the counts add up to the layouts evaluated."""
    import re

    from paracube.models.presets import preset
    from paracube.planner import hardware as hw
    from paracube.planner.search import search
    from paracube.planner.time_model import Cluster

    out = plan(capsys, "--model", "llama3-8b", "--gpus", "8", "--gpu", "h100", "--global-batch",
               "64", "--top", "1", "--explain")  # fmt: skip
    evaluated, fit = (
        int(n.replace(",", ""))
        for n in re.search(r"([\d,]+) layouts evaluated, ([\d,]+) fit", out).groups()
    )
    lost = int(
        re.search(r"does not fit in GPU memory \(([\d,]+) layouts\)", out).group(1).replace(",", "")
    )
    assert fit > 50 and evaluated == fit + lost
    h100 = hw.gpu("h100")
    cluster = Cluster(h100, 8, hw.interconnect(hw.DEFAULT_INTRA["h100"]), hw.interconnect("ib-hdr"))
    result = search(preset("llama3-8b"), cluster, 8, 64, precision="bf16", top=1)
    assert result.fitting == fit and len(result.ranked) == 50


def test_a_model_larger_than_a_node_is_scaled_from_the_fewest_nodes_that_hold_it(capsys):
    """GPT-3 175B fits on no node of 8 A100 80GB: its speed-up is measured from the fewest
    of 2, 4… nodes that hold it, which the plan on half as many GPUs confirms does not; with
    none below --gpus that holds it the plan says so rather than dropping the column."""
    import re

    argv = ["--model", "gpt3-175b", "--gpu", "a100-80gb", "--global-batch", "64", "--top", "1"]
    out = plan(capsys, *argv, "--gpus", "64")
    base = int(re.search(r"speed-up vs (\d+) GPUs", out).group(1))
    assert base in (16, 32)
    assert "fits no layout" in error(capsys, *argv, "--gpus", str(base // 2))
    alone = plan(capsys, *argv, "--gpus", str(base))
    assert "speed-up vs" not in alone
    assert "No speed-up column: gpt3-175b fits on none of" in alone


def test_json_carries_the_speed_up_its_baseline_and_the_counts(capsys):
    """--json emits every figure the table shows: each candidate's speed-up over the
    baseline (its tokens/s over the baseline's) and the scaling efficiency, the baseline
    itself, and the counts of the header."""
    out = json.loads(plan(capsys, "--model", "gpt3-1.3b", "--gpus", "8", "--global-batch", "64",
                          "--top", "2", "--json"))  # fmt: skip
    base = out["baseline"]
    assert base["gpus"] == 1 and base["layout"]["dp"] == 1
    for c in out["candidates"]:
        assert c["speedup"] == pytest.approx(c["time"]["tokens_per_s"] / base["tokens_per_s"])
        assert c["scaling_efficiency"] == pytest.approx(c["speedup"] / 8)
    assert out["fit"] <= out["evaluated"] and out["rejected"] == {}


def test_an_offloaded_optimizer_is_explained_and_one_gpu_has_no_speed_up(capsys):
    """llama2-7b on one A100 80GB at micro-batch 8 fits only with its optimizer in host
    memory: --explain says so with the memory it frees (the layout kept on the GPU needs
    more than the GPU has) and the optimizer seconds the step pays; one GPU is its own
    baseline, so no speed-up column (it showed 0.88× "over 1 GPU")."""
    import re

    argv = ["--model", "llama2-7b", "--gpus", "1", "--gpu", "a100-80gb", "--global-batch", "8",
            "--micro-batch", "8", "--top", "1"]  # fmt: skip
    out = plan(capsys, *argv, "--explain")
    assert "speed-up" not in out.lower() and "No speed-up column" not in out
    found = re.search(
        r"offloaded \(ZeRO-Offload\).*?([\d.]+) GB off each GPU — kept there, this layout would "
        r"need ([\d.]+) of (\d+) GB\. The step pays ([\d.]+) s for it .* against ([\d.]+) s on the GPU",
        out,
    )
    assert found, out
    freed, kept, capacity, offloaded, stepped_on_gpu = (float(g) for g in found.groups())
    top = best(capsys, *argv)
    assert top["layout"]["offload"] is True
    assert kept > capacity >= top["memory"]["total"] / 1e9
    from paracube.models.presets import preset
    from paracube.planner.layout import Layout
    from paracube.planner.layout_memory import peak_memory

    kept_layout = Layout(**{**top["layout"], "offload": False})
    states = peak_memory(preset("llama2-7b"), kept_layout, "bf16").model_states / 1e9
    assert freed == pytest.approx(states - top["memory"]["model_states"] / 1e9, abs=0.05)
    assert (
        offloaded == pytest.approx(top["time"]["optimizer"], rel=1e-2)
        and offloaded > stepped_on_gpu
    )


def test_more_gpus_are_suggested_only_where_they_would_hold_the_model(capsys):
    """With tp and pp pinned by --layout, more GPUs only add replicas: ZeRO-3 shards the
    states over them but every replica keeps its activations, so no GPU count is offered;
    unpinned (llama3-70b on 16 A100 80GB without recomputation), 32 do hold it."""
    argv = ["--model", "llama3-8b", "--gpus", "8", "--gpu", "a100-40gb", "--global-batch", "16",
            "--micro-batch", "2", "--recompute", "none", "--offload", "none"]  # fmt: skip
    pinned = error(capsys, *argv, "--layout", "tp=1,pp=1")
    assert "GPUs or more" not in pinned and "--recompute full" in pinned
    whole = error(capsys, *argv, "--layout", "dp=8,tp=1,pp=1")  # every degree fixed
    assert "GPUs or more" not in whole
    free = error(capsys, "--model", "llama3-70b", "--gpus", "16", "--global-batch", "64",
                 "--recompute", "none", "--offload", "none")  # fmt: skip
    assert "32 GPUs or more (32 hold it as" in free


def test_more_gpus_from_less_than_a_node_are_whole_nodes(capsys):
    """From 6 GPUs (one partial node of 8) the count offered is whole nodes of
    --gpus-per-node — a count `plan` itself accepts — and that count holds the model."""
    import re

    argv = ["--model", "llama3-70b", "--gpu", "a100-40gb", "--global-batch", "60",
            "--offload", "none"]  # fmt: skip
    err = error(capsys, *argv, "--gpus", "6")
    n = int(re.search(r"use (\d+) GPUs or more", err)[1])
    assert n % 8 == 0
    assert "| 1 |" in plan(capsys, *argv, "--gpus", str(n), "--top", "1")


def test_explain_says_why_the_layout_shards_its_states(capsys):
    """--explain's ZeRO line says what the same layout without ZeRO would be: over the GPU's
    memory (Llama 3 8B on 8 H100s: sharded to fit), or fitting and slower (GPT-3 350M on 8
    A100s: sharded for speed) — both figures the planner's own for that layout."""
    import re

    from paracube.models.presets import preset
    from paracube.planner.layout import Layout
    from paracube.planner.layout_memory import peak_memory

    argv = ["--model", "llama3-8b", "--gpus", "8", "--gpu", "h100", "--global-batch", "64",
            "--top", "1"]  # fmt: skip
    out = plan(capsys, *argv, "--explain")
    need = float(re.search(r"Without ZeRO this layout would need ([\d.]+) of the 85 GB", out)[1])
    layout = Layout(**{**best(capsys, *argv)["layout"], "zero": 0})
    assert need == pytest.approx(
        peak_memory(preset("llama3-8b"), layout, "bf16").total / 1e9, abs=0.06
    )
    assert need > 85

    argv = ["--model", "gpt3-350m", "--gpus", "8", "--global-batch", "64", "--top", "1"]
    out = plan(capsys, *argv, "--explain")
    found = re.search(
        r"Without ZeRO it fits too \(([\d.]+) GB\) at ([\d.]+) s a step against ([\d.]+) s", out
    )
    assert found, out
    top = best(capsys, *argv)
    assert top["layout"]["zero"] > 0
    plain = best(capsys, *argv, "--zero", "0", "--micro-batch", str(top["layout"]["micro_batch"]))
    assert float(found[2]) == pytest.approx(plain["time"]["step_time"], rel=2e-3)
    assert float(found[3]) == pytest.approx(top["time"]["step_time"], rel=2e-3)
    assert float(found[3]) < float(found[2])


def test_hybrid_sharding_on_the_command_line(capsys):
    """--shard-group N plans ZeRO-3 within groups of N (implying --zero 3), shown as hsdp=N
    and explained; an FSDP stack's search finds one node's group by itself on a slow
    network, where paracube's (which cannot run it) keeps FULL_SHARD or other layouts."""
    argv = ("--model", "llama2-7b", "--gpus", "64", "--gpu", "a100-80gb", "--global-batch", "64",
            "--inter", "ethernet-100g")  # fmt: skip
    fixed = best(capsys, *argv, "--layout", "dp=64,tp=1,pp=1", "--shard-group", "8")["layout"]
    assert (fixed["zero"], fixed["shard"]) == (3, 8)
    text = plan(capsys, *argv, "--layout", "dp=64,tp=1,pp=1", "--shard-group", "8", "--top", "1",
                "--explain")  # fmt: skip
    assert "zero3 hsdp=8" in text and "8 ranks of each hybrid shard group (8 replicas" in text
    fsdp = best(capsys, *argv, "--stack", "fsdp", "--layout", "dp=64,tp=1,pp=1", "--zero", "3")
    assert fsdp["layout"]["shard"] == 8
    own = best(capsys, *argv, "--layout", "dp=64,tp=1,pp=1", "--zero", "3")
    assert own["layout"]["shard"] == 0


def test_explain_gives_the_stacks_published_track_record(capsys):
    """A plan for a stack whose published runs paracube holds carries the planner's record on
    them — the runs of that stack's software on that GPU in that precision, each predicted ÷
    published as the published-run benchmark computes it — in --explain and --json; a stack
    with none (paracube's own, on a GPU) carries none."""
    from paracube.planner.published import PLANNED_AS, STACKS, evaluate, runs

    argv = ("--model", "llama2-7b", "--gpus", "8", "--gpu", "h100", "--global-batch", "64")
    rows = [
        r
        for r in runs()
        if STACKS[r["source"]] in PLANNED_AS["composer"]
        and r["gpu"] == "h100"
        and r["precision"] == "bf16"
    ]
    ratios = sorted(evaluate(r)["ratio"] for r in rows)
    within = sum(abs(x - 1) <= 0.15 for x in ratios)
    assert len(ratios) == 74 and within < len(ratios)  # MosaicML's two H100 BF16 tables
    record = json.loads(plan(capsys, *argv, "--stack", "composer", "--json"))["track_record"]
    assert (record["runs"], record["low"], record["high"], record["within"]) == (
        len(ratios),
        ratios[0],
        ratios[-1],
        within,
    )
    assert record["median"] == ratios[len(ratios) // 2]
    text = plan(capsys, *argv, "--stack", "composer", "--explain")
    line = next(x for x in text.splitlines() if x.startswith("- Track record:"))
    assert f"{len(ratios)} published runs of composer's software on H100 SXM in bf16" in line
    assert f"{ratios[0]:.2f}–{ratios[-1]:.2f}×" in line and f"{within} within ±15 %" in line
    fp8 = json.loads(plan(capsys, *argv, "--stack", "composer", "--precision", "fp8", "--json"))
    assert fp8["track_record"]["runs"] == sum(
        r["precision"] == "fp8" for r in runs() if r["source"] == "MosaicML (H100 FP8)"
    )
    assert json.loads(plan(capsys, *argv, "--json"))["track_record"] is None
    assert "Track record" not in plan(capsys, *argv, "--explain")


def test_explained_times_never_print_in_exponent_notation(capsys):
    """A step of thousands of seconds (Mixtral in fp32 on 16 A100s) and an optimizer step of
    a tenth of a millisecond (GPT-3 1.3B over 64 replicas) read as thousands of seconds
    grouped and milliseconds, not "1.18e+03 s" and "9.95e-05 s" (reasons.seconds_text)."""
    import re

    slow = plan(
        capsys,
        "--model",
        "mixtral-8x7b",
        "--gpu",
        "a100-80gb",
        "--gpus",
        "16",
        "--global-batch",
        "64",
        "--precision",
        "fp32",
        "--explain",
        "--top",
        "2",
    )
    fast = plan(capsys, "--model", "gpt3-1.3b", "--gpu", "a100-80gb", "--gpus", "256",
                "--global-batch", "64", "--precision", "fp32", "--explain", "--top", "2")  # fmt: skip
    for out in (slow, fast):
        assert not re.search(r"\de[+-]\d", out), out
    assert re.search(r"of (a|its) \d,\d{3} s step", slow) and re.search(
        r"optimizer \([\d.]+ ms\)", fast
    )


def test_fewer_micro_batches_than_stages_are_planned_with_gpipe_and_explained(capsys):
    """Two micro-batches on eight stages: 1F1B cannot run them, so the plan runs GPipe and
    --explain says why it is not 1F1B; asked for, 1F1B is refused with the reason."""
    argv = ["--model", "gpt3-1.3b", "--gpus", "8", "--gpu", "a100-80gb", "--global-batch", "12"]
    out = plan(capsys, *argv, "--layout", "pp=8", "--micro-batch", "6", "--explain")
    assert "| 1 | dp=1 tp=1 pp=8 b=6 m=2 gpipe |" in out
    assert "It runs gpipe because 1f1b cannot here (1f1b needs at least as many" in out
    err = error(capsys, *argv, "--layout", "pp=8", "--micro-batch", "6", "--schedule", "1f1b")
    assert "1f1b needs at least as many micro-batches as stages" in err
