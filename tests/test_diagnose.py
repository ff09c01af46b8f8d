"""``paracube diagnose``: every rank's timings in the metrics, stragglers named, injected
faults found as the first cause, a breakdown that adds up to the measured step, a loader
that hides a slow source — and the same training with or without it."""

from __future__ import annotations

import json

import pytest
import torch

from paracube.metrics import read_metrics
from tests.test_cli import run_cli

NANO = ("--model", "nano", "--steps", "10", "--no-progress", "--metrics-mode", "overwrite")


def train(tmp_path, name: str, *args: str) -> tuple[str, str]:
    path = str(tmp_path / f"{name}.jsonl")
    proc = run_cli("train", "--dp", "2", *NANO, "--metrics", path, *args)
    assert proc.returncode == 0, proc.stderr
    return path, proc.stdout


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> str:
    """One plain dp=2 run, read by the tests that need no fault."""
    return train(tmp_path_factory.mktemp("plain"), "plain")[0]


def diagnose(path: str, *args: str, calibration: str = "/nonexistent/calibration.json") -> dict:
    """``paracube diagnose PATH --json`` as figures; with no calibration of this machine
    (whatever the machine holds) unless ``calibration`` names one."""
    env = {"PARACUBE_CALIBRATION": calibration}
    proc = run_cli("diagnose", path, "--json", *args, env_extra=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def assert_adds_up(figures: dict) -> None:
    """The breakdown sums to the measured step (rank 0's whole step) within 5 %."""
    assert figures["breakdown_sum"] == pytest.approx(figures["step_time"], rel=0.05)
    assert all(v >= -1e-4 for k, v in figures["breakdown"].items() if k != "other"), figures


def test_every_rank_is_in_every_record_and_the_gather_is_counted(plain):
    records = read_metrics(plain)
    assert len(records) == 10
    for r in records:
        assert set(r["ranks"]) >= {"step_time", "data", "forward", "backward", "comm_exposed"}
        assert all(len(v) == 2 for v in r["ranks"].values())
        assert r["comm"]["all_gather/timing"]["calls"] == 1  # one small gather per step
        # the ledger counts an all-gather's output: 11 float64 fields from each of 2 ranks
        assert r["comm"]["all_gather/timing"]["bytes"] == 8 * len(r["ranks"]) * 2
    assert records[0]["run"]["coords"] == [{"pp": 0, "dp": 0, "tp": 0}, {"pp": 0, "dp": 1, "tp": 0}]
    spans = records[-1]["timeline"]["spans"]
    assert len(spans) == 2 and {s[0] for s in spans[1]} >= {"forward", "backward", "optimizer"}


# A calibration of a machine like this one (``paracube calibrate``'s keys).
CALIBRATION = dict(
    matmul_flops_per_thread=5e10,
    attention_flops_per_thread=2e10,
    memory_bandwidth=2e10,
    link_bandwidth=3e9,
    link_latency=8e-5,
    allreduce_bandwidth=1.2e9,
    allreduce_latency=3e-4,
    gather_scatter_pair_ratio=3.0,
)


def calibration(folder) -> str:
    path = folder / "cal.json"
    path.write_text(json.dumps(CALIBRATION))
    return str(path)


def test_the_planner_predicts_the_run_beside_the_measured(tmp_path, plain):
    """With a calibration of this machine, diagnose sets the planner's step time and
    speed-up for the run's own layout beside the measured ones: the time model's figures
    for dp=2 (the run's micro-batch, its two local ranks) and for one rank doing both
    micro-batches."""
    from paracube.models.presets import preset
    from paracube.planner import local
    from paracube.planner.layout import Layout
    from paracube.planner.time_model import Cluster, estimate

    path = plain
    assert diagnose(path)["speed"]["planner"] is None  # no calibration: no prediction
    predicted = diagnose(path, calibration=calibration(tmp_path))["speed"]["planner"]
    b = read_metrics(path)[0]["run"]["micro_batch"]
    rank_gpu, link = local.local_hardware(CALIBRATION, threads_per_rank=1, local_ranks=2)
    model = preset("nano")
    two = estimate(model, Layout(dp=2, micro_batch=b), Cluster(rank_gpu, 2, link, link), "fp32")
    one = estimate(
        model, Layout(micro_batch=b, microbatches=2), Cluster(rank_gpu, 1, link, link), "fp32"
    )
    assert predicted["step_time"] == pytest.approx(two.step_time, rel=1e-9)
    assert predicted["speedup"] == pytest.approx(two.tokens_per_s / one.tokens_per_s, rel=1e-9)
    assert 1 < predicted["speedup"] < 2


def test_a_slow_rank_is_named_and_is_the_first_cause(tmp_path):
    """Named within 5 steps, first in the verdict ``train --diagnose`` prints at the end
    and in ``diagnose``'s figures, and recorded in the metrics."""
    path, out = train(tmp_path, "slow", "--inject", "slow-rank=1:3", "--diagnose")
    assert "paracube diagnose:" in out and "1. waiting for a slower rank" in out
    named = [line for line in out.splitlines() if "straggler: rank 1 (pp=0 dp=1 tp=0" in line]
    assert named and "for 5 steps (since step 0)" in named[0], out  # within PATIENCE steps
    assert "rank 0 (" not in out.split("straggler:")[1]
    figures = diagnose(path, "--no-calibrate")
    assert figures["causes"][0]["cause"] == "straggler"
    assert "rank 1" in figures["causes"][0]["fix"]
    assert figures["slowest_rank"]["rank"] == 1 and figures["slowest_rank"]["ratio"] > 2
    assert_adds_up(figures)
    assert read_metrics(path)[-1]["stragglers"][0]["rank"] == 1


@pytest.mark.parametrize(
    "fault,cause", [("data-delay=0.03", "data"), ("comm-delay=0.03", "comm_dp")]
)
def test_an_injected_delay_is_the_first_cause(tmp_path, fault, cause):
    """30 ms per step: three times the worst wait a loaded CI host has put on a rank of
    this run (9 ms), so the injected cause is first whatever the machine's jitter."""
    path, _ = train(tmp_path, cause, "--inject", fault)
    figures = diagnose(path, "--no-calibrate")
    assert figures["causes"][0]["cause"] == cause, figures["causes"]
    assert_adds_up(figures)


def test_a_tiny_micro_batch_is_the_first_cause(tmp_path):
    """Micro-batch 1 with 32 accumulation steps: the per-token compute a larger micro-batch
    would save (measured by diagnose's calibration) outweighs the one gradient reduction —
    it is the first of the causes the layout makes. 32 micro-batches put it ~5× above the
    reduction on this machine; with 8 it was under 2×, and a clean-clone run once saw the
    all-reduce's jitter on the 2-core host outweigh it. Waits the machine makes (a rank
    descheduled on a loaded host reads as a straggler, a late batch as data) are not the
    layout's: CI once ranked such a wait first, and the injected-fault tests own them."""
    path, _ = train(tmp_path, "tiny", "--micro-batch", "1", "--grad-accum", "32")
    figures = diagnose(path)
    assert 0 < figures["small_batch_fraction"] < 1
    made_by_layout = [c for c in figures["causes"] if c["cause"] not in ("straggler", "data")]
    assert made_by_layout[0]["cause"] == "small_batch", figures["causes"]
    assert "--micro-batch" in made_by_layout[0]["fix"]
    assert_adds_up(figures)


def test_data_workers_hide_a_slow_source(tmp_path):
    """A source that takes ~half a step per micro-batch: on the training thread the step
    waits for all of it; two workers loading ahead bring the wait under 5 % of the step."""
    slow, _ = train(tmp_path, "slow-data", "--inject", "data-delay=0.012")
    ahead, _ = train(
        tmp_path, "ahead", "--inject", "data-delay=0.012", "--data-workers", "2", "--prefetch", "4"
    )
    waited = diagnose(slow, "--no-calibrate")
    hidden = diagnose(ahead, "--no-calibrate")
    assert waited["breakdown"]["data"] > 0.010  # the delay, every step
    assert hidden["breakdown"]["data"] < 0.05 * hidden["step_time"], hidden["breakdown"]
    # and the training is the same: the workers make the very batches the step would
    assert [r["loss"] for r in read_metrics(slow)] == [r["loss"] for r in read_metrics(ahead)]


def test_the_loader_hands_out_the_same_batches_in_any_order():
    from paracube.data.batches import RankBatches
    from paracube.data.loader import PrefetchLoader
    from paracube.data.sampler import ShardedBatchSampler

    class Mesh:  # what RankBatches reads of a mesh
        device = torch.device("cpu")

        def rank(self, axis):
            return 1

        def size(self, axis):
            return 2

    sampler = ShardedBatchSampler(torch.arange(5000) % 251, 16, 12, seed=3)
    plain = RankBatches(sampler, Mesh(), 3)  # type: ignore[arg-type]
    loader = PrefetchLoader(sampler, Mesh(), 3, workers=2, prefetch=4)  # type: ignore[arg-type]
    try:
        for step, k in [(0, 0), (0, 1), (0, 2), (1, 0), (5, 2), (1, 1), (0, 0)]:
            for a, b in zip(loader.micro_batch(step, k), plain.micro_batch(step, k)):
                assert torch.equal(a, b), (step, k)
    finally:
        loader.close()


@pytest.fixture(scope="module")
def pipelined(tmp_path_factory) -> str:
    """One run of 2 pipeline stages over 4 micro-batches."""
    folder = tmp_path_factory.mktemp("pipelined")
    return train(folder, "pp", "--pp", "2", "--dp", "1", "--microbatches", "4")[0]


def test_pictures_and_trace(tmp_path, pipelined):
    path = pipelined
    png, trace = str(tmp_path / "d.png"), str(tmp_path / "t.json")
    proc = run_cli("diagnose", path, "--no-calibrate", "--plot", png, "--trace", trace)
    assert proc.returncode == 0, proc.stderr
    assert "pipeline bubble" in proc.stdout
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    kinds = {(e["tid"], e["name"]) for e in events if e["ph"] == "X"}
    assert {(0, "F"), (0, "B"), (1, "F"), (1, "B")} <= kinds  # each stage's actions


def test_the_planner_offers_its_faster_layout_with_the_command(tmp_path, pipelined):
    """A pipeline of 2 stages over 4 micro-batches (bubble 1/5): the planner's fastest
    layout for the same 2 ranks and global batch — what its search ranks first — is
    offered with its command, being predicted ≥ 10 % faster than the run's own."""
    from paracube.models.presets import preset
    from paracube.planner import local
    from paracube.planner.search import search
    from paracube.planner.time_model import Cluster

    path = pipelined
    predicted = diagnose(path, "--no-calibrate", calibration=calibration(tmp_path))["speed"]
    better = predicted["planner"]["better"]
    rank_gpu, link = local.local_hardware(CALIBRATION, threads_per_rank=1, local_ranks=2)
    batch = 4 * read_metrics(path)[0]["run"]["micro_batch"]  # 4 micro-batches a step
    best = search(preset("nano"), Cluster(rank_gpu, 2, link, link), 2, batch, precision="fp32")
    assert better["step_time"] == pytest.approx(best.ranked[0].time.step_time, rel=1e-9)
    assert better["step_time"] <= 0.9 * predicted["planner"]["step_time"]
    assert better["command"].startswith("paracube train --model nano --dp ")
    assert f"--dp {best.ranked[0].layout.dp} " in better["command"]


def test_scale_runs_the_job_at_each_point_and_diagnoses_it(tmp_path):
    """``paracube scale``: the job at dp = 1 and 2 (weak scaling), each point's figures
    those of ``diagnose`` on the run it wrote; the speed-up over dp=1 and the efficiency
    derived from them."""
    runs, png = tmp_path / "runs", str(tmp_path / "scale.png")
    proc = run_cli(
        "scale", "--model", "nano", "--steps", "6", "--points", "1,2",
        "--runs-dir", str(runs), "--plot", png, "--json",
        env_extra={"PARACUBE_CALIBRATION": "/nonexistent/calibration.json"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout[proc.stdout.index("[") :])
    assert [r["dp"] for r in rows] == [1, 2]
    points = {dp: diagnose(str(runs / f"dp{dp}.jsonl")) for dp in (1, 2)}
    assert read_metrics(str(runs / "dp2.jsonl"))[0]["run"]["layout"]["dp"] == 2
    for r in rows:
        assert r["tokens_per_s"] == pytest.approx(points[r["dp"]]["speed"]["tokens_per_s"])
    one, two = (points[dp]["speed"]["tokens_per_s"] for dp in (1, 2))
    assert rows[0]["speedup"] == 1 and rows[1]["speedup"] == pytest.approx(two / one)
    assert rows[1]["efficiency"] == pytest.approx(two / one / 2)
    assert sum(rows[1]["shares"].values()) == pytest.approx(1, rel=0.05)
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_profile_writes_a_torch_trace_per_rank_and_step(tmp_path):
    folder = tmp_path / "prof"
    proc = run_cli(
        "train", "--dp", "2", "--model", "nano", "--steps", "4", "--no-progress",
        "--profile", "1-2", "--profile-dir", str(folder),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in folder.iterdir()) == [
        "rank0-step1.json", "rank0-step2.json", "rank1-step1.json", "rank1-step2.json",
    ]  # fmt: skip
    with open(folder / "rank1-step2.json") as f:
        names = {e.get("name", "") for e in json.load(f)["traceEvents"]}
    assert any(n.startswith("aten::") for n in names)  # the step's operators, traced
