"""Pure rank math of the (pp, dp, tp) mesh, without processes."""

from __future__ import annotations

import itertools

import pytest

from paracube.errors import ConfigError
from paracube.mesh.layout import MeshLayout

SHAPES = [(1, 1, 1), (1, 4, 1), (2, 2, 2), (4, 2, 8), (3, 5, 2), (8, 1, 4)]


def test_worked_example_2x2x2():
    m = MeshLayout(pp=2, dp=2, tp=2)
    assert m.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert m.groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert m.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert m.coords(6) == {"pp": 1, "dp": 1, "tp": 0}


@pytest.mark.parametrize("shape", SHAPES)
def test_coords_and_rank_are_inverse(shape):
    m = MeshLayout(*shape)
    seen = set()
    for r in range(m.world_size):
        c = m.coords(r)
        assert m.rank(**c) == r
        seen.add(tuple(c[a] for a in ("pp", "dp", "tp")))
    assert seen == set(itertools.product(*(range(s) for s in shape)))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("axis", ["pp", "dp", "tp"])
def test_groups_partition_the_world(shape, axis):
    m = MeshLayout(*shape)
    groups = m.groups(axis)
    assert len(groups) == m.world_size // m.size(axis)
    assert all(len(g) == m.size(axis) for g in groups)
    assert sorted(r for g in groups for r in g) == list(range(m.world_size))
    for g in groups:  # members differ only in this axis's coordinate
        others = {tuple(v for a, v in m.coords(r).items() if a != axis) for r in g}
        assert len(others) == 1
        assert [m.coords(r)[axis] for r in g] == list(range(m.size(axis)))
        for r in g:
            assert m.group_of(r, axis) == g


@pytest.mark.parametrize("shape", SHAPES)
def test_tensor_parallel_groups_are_consecutive_ranks(shape):
    """tp innermost: a tp group is a run of consecutive ranks, so it fits inside a node."""
    m = MeshLayout(*shape)
    for g in m.groups("tp"):
        assert g == list(range(g[0], g[0] + m.tp))


def test_pipeline_is_outermost():
    m = MeshLayout(pp=4, dp=2, tp=8)  # 64 ranks: each stage is a block of 16 consecutive ranks
    for r in range(64):
        assert m.coords(r)["pp"] == r // 16


def test_stage_neighbours():
    m = MeshLayout(pp=3, dp=2, tp=2)
    assert m.stage_neighbours(1) == (None, 5)
    assert m.stage_neighbours(5) == (1, 9)
    assert m.stage_neighbours(9) == (5, None)
    assert MeshLayout(dp=4).stage_neighbours(2) == (None, None)


@pytest.mark.parametrize("bad", [dict(pp=0), dict(dp=-1), dict(tp=1.5)])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(ConfigError, match="positive integer"):
        MeshLayout(**bad)


def test_bad_rank_and_axis():
    m = MeshLayout(dp=2)
    with pytest.raises(ConfigError, match="rank 2 is outside 0..1"):
        m.coords(2)
    with pytest.raises(ConfigError, match="unknown mesh axis 'ep'"):
        m.groups("ep")
