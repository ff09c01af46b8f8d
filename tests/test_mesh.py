"""ProcessMesh on real gloo groups: DeviceMesh builds exactly the groups of the rank math."""

from __future__ import annotations

import pytest
import torch

from paracube.config import ParallelConfig
from paracube.mesh.layout import MeshLayout


def build_and_probe(pp: int, dp: int, tp: int):
    import torch.distributed as dist

    from paracube.comm import ops
    from paracube.mesh.mesh import ProcessMesh

    mesh = ProcessMesh(ParallelConfig(pp=pp, dp=dp, tp=tp))
    mesh.check()
    sums = {}
    for axis in ("pp", "dp", "tp"):  # each group sums its members' global ranks
        t = torch.tensor([float(dist.get_rank())])
        ops.all_reduce(t, mesh.group(axis), mesh.ledger, tag=axis)
        sums[axis] = t.item()
    return {a: mesh.rank(a) for a in ("pp", "dp", "tp")}, sums, mesh.stage_neighbours()


@pytest.mark.parametrize("shape", [(2, 2, 1), (1, 2, 2), (2, 1, 2), (4, 1, 1), (1, 1, 4)])
def test_mesh_groups_match_layout(pools, shape):
    layout = MeshLayout(*shape)
    results = pools(4).run(build_and_probe, *shape)
    for rank, (coords, sums, neighbours) in enumerate(results):
        assert coords == layout.coords(rank)
        for axis in ("pp", "dp", "tp"):
            assert sums[axis] == sum(layout.group_of(rank, axis))
        assert neighbours == layout.stage_neighbours(rank)
