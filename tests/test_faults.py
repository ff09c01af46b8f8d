"""Faults during a run: each ends the whole job promptly, in one line, with its status,
leaving no process and no temporary folder behind."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from paracube.divergence import FP16_MAX_SKIPS

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--model", "nano", "--micro-batch", "2", "--no-progress", "--eval-every", "0"]


class Job:
    """``paracube train …`` in its own session, watched through its metrics file."""

    def __init__(self, tmp: Path, *args: str):
        self.metrics = tmp / "m.jsonl"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(k, None)
        self.temp_before = _paracube_temp()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "paracube",
                "train",
                *FAST,
                *args,
                "--metrics",
                str(self.metrics),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def wait_for_steps(self, n: int, limit: float = 120) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.metrics.exists() and len(self.metrics.read_text().splitlines()) >= n:
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"the job ended early: {self.proc.communicate()[1]}")
            time.sleep(0.1)
        raise AssertionError(f"no {n} steps within {limit} s")

    def workers(self) -> list[int]:
        """The launcher's rank processes: forked by its rank server (multiprocessing's
        forkserver, the launcher's child)."""
        parents = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                cmdline = (stat.parent / "cmdline").read_bytes()
            except OSError:
                continue
            parents[int(stat.parent.name)] = (int(fields[1]), b"forkserver" in cmdline)
        servers = {pid for pid, (ppid, fs) in parents.items() if ppid == self.proc.pid and fs}
        return sorted(pid for pid, (ppid, _) in parents.items() if ppid in servers)

    def finish(self, limit: float) -> tuple[int, str, float]:
        """(exit status, stderr, seconds it took) — killing everything if over ``limit``."""
        start = time.monotonic()
        try:
            self.out, err = self.proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.out, err = self.proc.communicate()
            raise AssertionError(f"the job did not end within {limit} s: {err}") from None
        return self.proc.returncode, err, time.monotonic() - start

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.metrics.read_text().splitlines()]

    def assert_clean(self) -> None:
        """No rank process left, no temporary folder of the launcher's left behind."""
        time.sleep(0.5)
        assert not self.workers(), "rank processes survived the job"
        assert not _session_processes(self.proc.pid), "a process of the job's session survived"
        assert _paracube_temp() <= self.temp_before, "the launcher left a temporary folder"


def _session_processes(sid: int) -> list[int]:
    """Live (not zombie) processes of session ``sid`` — an orphaned zombie is only waiting
    for this container's init to reap it."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            found.append(int(stat.parent.name))
    return found


def _paracube_temp() -> set[str]:
    tmp = Path(tempfile.gettempdir())
    return {p.name for p in tmp.iterdir() if p.name.startswith(("paracube-", "torchelastic_"))}


def one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("layout", [["--dp", "2"], ["--pp", "2", "--microbatches", "2"]])
def test_a_stalled_rank_ends_the_job_within_the_timeout(tmp_path, layout):
    """SIGSTOP one rank: the other's collective times out after --timeout, names the
    stalled peer and where it was, and the job ends a few seconds later (exit 1)."""
    timeout = 6
    job = Job(tmp_path, *layout, "--steps", "100000", "--timeout", str(timeout))
    job.wait_for_steps(2)
    stalled = job.workers()[-1]
    os.kill(stalled, signal.SIGSTOP)
    try:
        code, err, took = job.finish(limit=timeout + 30)
    finally:
        try:
            os.kill(stalled, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert code == 1, err
    line = one_line(err)
    assert "failed in step" in line and "last answered" in line, line
    assert "(its process is stopped)" in line, line
    assert took < timeout + 10, f"{took:.1f} s after the stall"  # the timeout, plus seconds
    job.assert_clean()


def test_divergence_stops_at_the_first_non_finite_step(tmp_path):
    job = Job(tmp_path, "--lr", "1e6", "--warmup-steps", "0", "--steps", "30")
    code, err, _ = job.finish(limit=120)
    assert code == 3, err
    records = job.records()
    last = records[-1]
    assert not (math.isfinite(last["loss"]) and math.isfinite(last["grad_norm"]))
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in records[:-1])
    line = one_line(err)
    assert f"step {last['step']}:" in line and "training diverged" in line and "--lr" in line
    job.assert_clean()


def test_divergence_can_be_skipped(tmp_path):
    """--on-nan skip: the non-finite steps are skipped (not stepped with), the run ends."""
    job = Job(tmp_path, "--lr", "1e6", "--warmup-steps", "0", "--steps", "6", "--on-nan", "skip")
    code, err, _ = job.finish(limit=120)
    assert code == 0, err
    records = job.records()
    assert len(records) == 6
    assert any(r.get("skipped") for r in records)


def test_fp16_stops_after_consecutive_overflows(tmp_path):
    """A fixed loss scale of 2**24 overflows fp16's gradients on every step while the loss
    stays finite: the run stops after FP16_MAX_SKIPS skipped steps in a row, not at the end."""
    job = Job(tmp_path, "--precision", "fp16", "--loss-scale", str(2**24), "--steps", "60")
    code, err, _ = job.finish(limit=180)
    assert code == 3, err
    line = one_line(err)
    assert f"fp16 gradients overflowed on {FP16_MAX_SKIPS} steps in a row" in line, line
    records = job.records()
    assert len(records) == FP16_MAX_SKIPS and all(r["skipped"] for r in records)
    assert all(math.isfinite(r["loss"]) for r in records)
    job.assert_clean()


@pytest.mark.parametrize(
    "sig,group", [(signal.SIGINT, True), (signal.SIGTERM, False), (signal.SIGHUP, False)]
)
def test_signals_stop_the_job_in_one_line(tmp_path, sig, group):
    """Ctrl-C (SIGINT to the whole terminal group), SIGTERM, SIGHUP: exit 128 + N."""
    job = Job(tmp_path, "--dp", "2", "--steps", "100000")
    job.wait_for_steps(1)
    (os.killpg if group else os.kill)(job.proc.pid, sig)
    code, err, _ = job.finish(limit=30)
    assert code == 128 + sig, err
    assert one_line(err) == f"paracube: interrupted by {sig.name}: the 2 ranks were stopped"
    job.assert_clean()


def test_a_killed_rank_is_named(tmp_path):
    """SIGKILL one rank: its peer's collective fails at once and names the dead rank."""
    job = Job(tmp_path, "--dp", "2", "--steps", "100000", "--timeout", "20")
    job.wait_for_steps(1)
    os.kill(job.workers()[0], signal.SIGKILL)
    code, err, took = job.finish(limit=40)
    assert code == 1, err
    line = one_line(err)
    # Its peer names it — or, if the launcher stopped the peer before its collective
    # noticed, the launcher does: either way one line naming the dead rank.
    peer_said = "failed in step" in line and "(its process has died)" in line
    assert peer_said or "was killed by SIGKILL; the job was stopped" in line, line
    assert took < 15, f"{took:.1f} s after the kill"
    job.assert_clean()


def test_deleted_metrics_stop_the_run(tmp_path):
    """The record is never lost silently: its file deleted mid-run stops the job (exit 1)."""
    job = Job(tmp_path, "--dp", "2", "--steps", "100000")
    job.wait_for_steps(1)
    job.metrics.unlink()
    code, err, _ = job.finish(limit=60)
    assert code == 1, err
    assert "was deleted during the run" in one_line(err)
    job.assert_clean()


def test_two_nodes_meet_at_the_endpoint(tmp_path):
    """--nnodes 2 --rdzv-endpoint: the same command on two "machines" (here two launchers
    on loopback) forms one job; the global rank 0 writes the metrics; both exit 0."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nodes = ["--dp", "2", "--steps", "3", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    first = Job(tmp_path, *nodes)
    time.sleep(2)  # the first hosts the meeting point; the second joins it
    second = Job(tmp_path, *nodes, "--metrics-mode", "append")
    (code_a, err_a, _), (code_b, err_b, _) = first.finish(120), second.finish(120)
    assert (code_a, code_b) == (0, 0), err_a + err_b
    assert [r["step"] for r in first.records()] == [0, 1, 2]
    for err in (err_a, err_b):
        err = _without_store_teardown_race(err)
        assert "error" not in err.lower() and "Traceback" not in err, err


def _without_store_teardown_race(err: str) -> str:
    """After the job, torch's elastic agent on each node closes the rendezvous through the
    store the first node hosts; when that node has already exited, torch's C++ logs a
    warning with a stack dump ("[W… TCPStore.cpp] … recvVector failed … Connection was
    likely closed"). Seen once in a full-suite run, with both nodes at exit 0 and the whole
    record written: torch's teardown, after the job — cut from what is checked."""
    start = err.find("[W")
    tail = err[start:]
    if start >= 0 and "TCPStore" in tail and "Connection was likely closed" in tail:
        return err[:start]
    return err


def test_a_killed_rank_restarts_from_the_last_checkpoint(tmp_path):
    """--max-restarts 2: SIGKILL one rank mid-run; the job restarts from the newest
    checkpoint and ends with exactly the uninterrupted run's weights (exit 0)."""
    from safetensors.torch import load_file

    from paracube.checkpoint.export import export
    from paracube.checkpoint.store import complete_checkpoints

    steps = ["--dp", "2", "--steps", "40", "--save-every", "4", "--timeout", "20"]
    job = Job(tmp_path, *steps, "--save-dir", str(tmp_path / "a"), "--max-restarts", "2")
    job.wait_for_steps(10)
    os.kill(job.workers()[1], signal.SIGKILL)
    code, err, _ = job.finish(limit=180)
    assert code == 0, err
    assert "restart 1 of 2: resuming from" in job.out and "at step" in job.out
    whole_dir = tmp_path / "whole"
    whole_dir.mkdir()
    whole = Job(whole_dir, *steps, "--save-dir", str(tmp_path / "b"))
    assert whole.finish(limit=180)[0] == 0
    outputs = []
    for run in ("a", "b"):
        out = tmp_path / f"{run}.safetensors"
        export(complete_checkpoints(tmp_path / run)[-1], str(out))
        outputs.append(load_file(str(out)))
    assert outputs[0].keys() == outputs[1].keys()
    for name in outputs[0]:
        assert torch.equal(outputs[0][name], outputs[1][name]), name
    job.assert_clean()


def test_a_kill_while_writing_a_checkpoint_leaves_the_previous_one_loadable(tmp_path):
    """The whole job SIGKILLed while its ranks are writing a checkpoint (the partial folder
    already holds data): the previous checkpoint is intact, the partial one is not taken
    for a checkpoint, and --resume auto continues from the previous one."""
    from paracube.checkpoint.store import complete_checkpoints

    ck = tmp_path / "ck"
    args = ["--dp", "2", "--model", "small", "--steps", "200", "--save-every", "2"]
    for attempt in range(3):  # the kill must land inside a write (tens of ms): retried
        shutil.rmtree(ck, ignore_errors=True)
        run = tmp_path / f"attempt{attempt}"
        run.mkdir()
        job = Job(run, *args, "--save-dir", str(ck))
        writing = _wait_for_a_write(job, ck, after_step=2)
        os.killpg(job.proc.pid, signal.SIGKILL)
        job.finish(limit=30)
        for name in _paracube_temp() - job.temp_before:  # a SIGKILLed launcher cannot
            shutil.rmtree(Path(tempfile.gettempdir()) / name, ignore_errors=True)  # tidy up
        if writing.exists():  # killed mid-write, not after the commit
            break
    else:
        pytest.fail("no kill landed inside a checkpoint write in 3 attempts")
    done = complete_checkpoints(ck)  # the partial folder is not among them
    last = int(done[-1].name.split("-")[1])
    assert writing.name == f".step-{last + 2:08d}.partial"  # the save after the newest
    resumed = subprocess.run(
        [sys.executable, "-m", "paracube", "train", *FAST, *args[:4], "--steps",
         str(last + 1), "--save-dir", str(ck), "--resume", "auto"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {done[-1]} at step" in resumed.stdout


def _wait_for_a_write(job: Job, ck: Path, after_step: int, limit: float = 120) -> Path:
    """The partial folder of a save after ``after_step`` once a rank has written data in
    it (polled every millisecond)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for partial in ck.glob(".step-*.partial"):
            if int(partial.name[6:14]) <= after_step:
                continue
            try:
                if any(f.stat().st_size > 0 for f in partial.iterdir()):
                    return partial
            except OSError:  # committed (renamed) meanwhile
                continue
        if job.proc.poll() is not None:
            raise AssertionError(f"the job ended early: {job.proc.communicate()[1]}")
        time.sleep(0.001)
    raise AssertionError(f"no checkpoint write seen within {limit} s")
