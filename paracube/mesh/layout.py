"""Pure rank math for the (pp, dp, tp) process mesh. No torch.distributed here.

Ranks are laid out row-major over the axes ``pp, dp, tp`` (outermost to innermost):

    rank = (pp_index · dp + dp_index) · tp + tp_index

so the ranks of one tensor-parallel group are consecutive — on a node of G GPUs with
tp ≤ G they share the fast intra-node links — and pipeline stages are the farthest apart,
crossing nodes, where only point-to-point activations travel (Narayanan et al. 2021, §3).

Worked example, pp=2, dp=2, tp=2 (8 ranks)::

    rank:        0  1  2  3  4  5  6  7
    (pp,dp,tp):  000 001 010 011 100 101 110 111

    tp groups: [0,1] [2,3] [4,5] [6,7]
    dp groups: [0,2] [1,3] [4,6] [5,7]
    pp groups: [0,4] [1,5] [2,6] [3,7]
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from paracube.config import AXES
from paracube.errors import ConfigError


@dataclass(frozen=True)
class MeshLayout:
    """Sizes of the three axes; every method is plain arithmetic on them.

    >>> mesh = MeshLayout(pp=2, dp=2, tp=2)
    >>> mesh.coords(6)
    {'pp': 1, 'dp': 1, 'tp': 0}
    >>> mesh.groups("dp")
    [[0, 2], [1, 3], [4, 6], [5, 7]]
    >>> mesh.group_of(5, "pp")
    [1, 5]
    """

    pp: int = 1
    dp: int = 1
    tp: int = 1

    def __post_init__(self) -> None:
        for axis in AXES:
            size = getattr(self, axis)
            if not isinstance(size, int) or size <= 0:
                raise ConfigError(f"mesh axis {axis} must be a positive integer, got {size!r}")

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.pp, self.dp, self.tp)

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    def size(self, axis: str) -> int:
        return getattr(self, _check_axis(axis))

    def coords(self, rank: int) -> dict[str, int]:
        """``rank → {pp, dp, tp}``.  In the 2×2×2 example, rank 6 → pp=1, dp=1, tp=0."""
        self._check_rank(rank)
        rest, tp = divmod(rank, self.tp)
        pp, dp = divmod(rest, self.dp)
        return {"pp": pp, "dp": dp, "tp": tp}

    def where(self, rank: int) -> str:
        """``rank`` as the coordinates an error message names: ``"pp=1 dp=1 tp=0"``."""
        return " ".join(f"{axis}={i}" for axis, i in self.coords(rank).items())

    def rank(self, *, pp: int = 0, dp: int = 0, tp: int = 0) -> int:
        """``(pp, dp, tp) → rank``, the inverse of :meth:`coords`."""
        for axis, index in (("pp", pp), ("dp", dp), ("tp", tp)):
            if not 0 <= index < self.size(axis):
                raise ConfigError(f"{axis} index {index} is outside 0..{self.size(axis) - 1}")
        return (pp * self.dp + dp) * self.tp + tp

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along ``axis``: the ranks that differ only in that coordinate.

        There are ``world / size(axis)`` groups of ``size(axis)`` ranks each, and together
        they partition the world. Listed in order of their smallest rank.
        """
        _check_axis(axis)
        others = [a for a in AXES if a != axis]
        found = []
        for fixed in itertools.product(*(range(self.size(a)) for a in others)):
            where = dict(zip(others, fixed))
            found.append([self.rank(**{**where, axis: i}) for i in range(self.size(axis))])
        return sorted(found)

    def group_of(self, rank: int, axis: str) -> list[int]:
        """The ranks of ``rank``'s own group along ``axis`` (it is one of them)."""
        c = self.coords(rank)
        return [self.rank(**{**c, axis: i}) for i in range(self.size(axis))]

    def stage_neighbours(self, rank: int) -> tuple[int | None, int | None]:
        """Ranks of the previous and next pipeline stage with the same (dp, tp) place;
        ``None`` at the first / last stage."""
        c = self.coords(rank)
        prev = self.rank(**{**c, "pp": c["pp"] - 1}) if c["pp"] > 0 else None
        nxt = self.rank(**{**c, "pp": c["pp"] + 1}) if c["pp"] < self.pp - 1 else None
        return prev, nxt

    def describe(self) -> str:
        return f"pp={self.pp} × dp={self.dp} × tp={self.tp} = {self.world_size} ranks"

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ConfigError(
                f"rank {rank} is outside 0..{self.world_size - 1} for {self.describe()}"
            )


def _check_axis(axis: str) -> str:
    if axis not in AXES:
        raise ConfigError(f"unknown mesh axis {axis!r}: choose one of {', '.join(AXES)}")
    return axis
