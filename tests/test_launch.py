"""The local launcher's ranks: forked from a rank server that imported what every rank
needs once (on a CPU-only machine), each told where to say it explains the job's end."""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

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


@pytest.mark.skipif(torch.cuda.is_available(), reason="ranks are spawned on a CUDA machine")
def test_ranks_fork_from_a_server_that_imported_torch_once(tmp_path):
    assert rank_start_method() == "forkserver"
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
