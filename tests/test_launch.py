"""The local launcher's ranks: forked from a rank server that imported what every rank
needs once (on a machine without a GPU driver), each told where to say it explains the
job's end; and a command line checked before anything imports torch."""

from __future__ import annotations

import json
import os
import sys

import pytest

from paracube.launch import EXPLAINED_ENV, RANK_MODULES, launch_local, rank_start_method


def _report(out_dir: str) -> None:
    """A rank's entry: what was already imported when it started, and its parent."""
    rank = os.environ["LOCAL_RANK"]
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(
            {
                "preloaded": [m for m in RANK_MODULES if m in sys.modules],
                "explained": os.environ.get(EXPLAINED_ENV, ""),
                "parent": os.getppid(),
            },
            f,
        )


@pytest.mark.skipif(rank_start_method() == "spawn", reason="a GPU driver: ranks are spawned")
def test_ranks_fork_from_a_server_that_imported_torch_once(tmp_path):
    # twice from one process: the second job's ranks come from the same server, and each
    # job's ranks get that job's own path to say they explain its end
    seen = []
    for job in range(2):
        out = tmp_path / str(job)
        out.mkdir()
        assert launch_local(2, _report, str(out)) == 0
        ranks = [json.loads((out / f"{r}.json").read_text()) for r in range(2)]
        assert all(set(RANK_MODULES) <= set(r["preloaded"]) for r in ranks), ranks
        assert len({r["parent"] for r in ranks}) == 1  # both forked by one server …
        assert ranks[0]["parent"] != os.getpid()  # … which is not this process
        assert len({r["explained"] for r in ranks}) == 1 and ranks[0]["explained"]
        seen.append((ranks[0]["parent"], ranks[0]["explained"]))
    assert seen[0][0] == seen[1][0] and seen[0][1] != seen[1][1]


def test_a_job_is_checked_before_torch_is_imported():
    """Parsing and checking a job import no torch: a bad command fails at once, and the
    rank server can import torch while the launcher does."""
    import subprocess

    code = (
        "import sys\n"
        "from paracube.cli import main\n"
        "status = main(['train', '--dp', '0'])\n"
        "assert status == 2 and 'torch' not in sys.modules, sorted(sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "paracube: error: --dp" in out.stderr
