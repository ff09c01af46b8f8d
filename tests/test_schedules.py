"""Pipeline schedules as data, run in the simulator (no processes)."""

from __future__ import annotations

import pytest

from paracube.errors import ConfigError
from paracube.pipeline import SCHEDULES, Action, Costs, build_schedule, simulate

SHAPES = [(2, 2), (2, 4), (3, 7), (4, 4), (4, 8), (4, 12), (8, 16)]


def _every_action_once(lists, m, v, split):
    kinds = ("F", "I", "W") if split else ("F", "B")
    for acts in lists:
        assert sorted((a.kind, a.mb, a.chunk) for a in acts) == sorted(
            (k, mb, c) for k in kinds for mb in range(m) for c in range(v)
        )


@pytest.mark.parametrize("p,m", SHAPES)
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_registered_schedule_meets_its_own_formulas(name, p, m):
    """Each schedule of the registry, at every shape it accepts: every action exactly once,
    the simulated idle time of every rank and the bubble fraction equal to the schedule's
    formulas (unit and uneven costs), and no stage holding more micro-batches than its
    registered peak (the first stage exactly it). A new schedule is tested here unasked."""
    sched = SCHEDULES[name]
    tried = 0
    for v in (2, 3) if sched.chunked else (1,):
        try:
            sched.check(p, m, v)
        except ConfigError:
            continue
        tried += 1
        lists = sched.build(p, m, v)
        _every_action_once(lists, m, v, split=sched.splits_backward)
        for costs in (Costs(), Costs(F=1.0, I=1.3, W=0.7)):
            t = simulate(lists, costs, v=v)
            idle = sched.idle_per_rank(p, m, v, costs.F, costs.I, costs.W)
            assert [t.idle(r) for r in range(p)] == pytest.approx([idle] * p)
            assert t.bubble_fraction == pytest.approx(
                sched.bubble_fraction(p, m, v, costs.F, costs.I, costs.W)
            )
        peaks = [t.peak_in_flight(r) for r in range(p)]
        assert all(
            peak <= sched.in_flight(p, m, v, stage=r) + 1e-12 for r, peak in enumerate(peaks)
        )
        assert peaks[0] == pytest.approx(sched.in_flight(p, m, v, stage=0))
    if not sched.needs_m_at_least_p and not sched.chunked:
        assert tried  # a schedule without constraints runs at every shape


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_schedules_words_for_its_bubble_are_its_formula(name):
    """``plan --explain`` says how more micro-batches shrink a schedule's bubble in the
    schedule's own words (``shrinks_as``: it said (p−1)/m for every schedule); read as
    arithmetic they are the planner's idle ÷ busy, for every schedule of the registry — at a
    block's own pass costs F, I, W where the schedule splits the backward."""
    sched = SCHEDULES[name]
    expression = sched.shrinks_as.replace("−", "-").replace("·", "*").replace("3m", "3*m")
    for p, m, v in [(4, 8, 2), (8, 16, 4), (3, 12, 3)]:
        for F, I, W in [(1.0, 1.0, 1.0), (18.5, 18.1, 9.3)]:  # equal; Qi et al.'s Table 6
            costs = {"F": F, "I": I, "W": W}
            value = eval(
                expression, {}, {"p": p, "m": m, "v": v, **costs}
            )  # the schedule's own words, not input
            expected = sched.idle_over_busy(p, m, v if sched.chunked else 1, **costs)
            assert value == pytest.approx(expected)


@pytest.mark.parametrize("p,m", SHAPES)
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_bubble_is_the_formula(name, p, m):
    """Bubble (p−1)/(m+p−1) (Narayanan et al. 2021), at unit and at uneven costs."""
    lists = build_schedule(name, p, m)
    _every_action_once(lists, m, 1, split=False)
    for costs in (Costs(), Costs(F=1.0, I=1.5, W=0.5)):
        t = simulate(lists, costs)
        assert t.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    peaks = [t.peak_in_flight(r) for r in range(p)]
    if name == "gpipe":
        assert peaks == [m] * p
    else:  # 1F1B: stage r holds at most p − r micro-batches
        assert peaks == [min(p - r, m) for r in range(p)]


@pytest.mark.parametrize(
    "p,m,v", [(2, 4, 2), (2, 4, 3), (4, 8, 2), (4, 8, 4), (3, 9, 2), (4, 4, 2)]
)
def test_interleaved_bubble_is_the_formula(p, m, v):
    """(p−1)/(v·m + p−1): v chunks shrink the bubble by v (Narayanan et al. 2021, §2.2)."""
    lists = build_schedule("interleaved-1f1b", p, m, v)
    _every_action_once(lists, m, v, split=False)
    t = simulate(lists, Costs(), v=v)
    assert t.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)


@pytest.mark.parametrize("p,m", SHAPES)
@pytest.mark.parametrize("costs", [Costs(), Costs(F=1.0, I=1.3, W=0.7), Costs(F=2.0, I=2.0, W=1.0)])
def test_zero_bubble_h1_idle_is_the_formula(p, m, costs):
    """Idle per rank: ZB-H1 (p−1)(T_F+T_B−T_W) against 1F1B's (p−1)(T_F+T_B+T_W), with
    T_B the input-gradient pass (Qi et al. 2024); peak memory stays at 1F1B's p."""
    lists = build_schedule("zb-h1", p, m)
    _every_action_once(lists, m, 1, split=True)
    zb, base = simulate(lists, costs), simulate(build_schedule("1f1b", p, m), costs)
    for r in range(p):
        assert zb.idle(r) == pytest.approx((p - 1) * (costs.F + costs.I - costs.W))
        assert base.idle(r) == pytest.approx((p - 1) * (costs.F + costs.I + costs.W))
        assert zb.peak_in_flight(r) <= p


def test_communication_latency_delays_but_does_not_deadlock():
    t0 = simulate(build_schedule("1f1b", 4, 8), Costs())
    t1 = simulate(build_schedule("1f1b", 4, 8), Costs(comm=0.5))
    assert t1.makespan > t0.makespan


def test_deadlock_is_detected():
    lists = [
        [Action("B", 0), Action("F", 0)],
        [Action("F", 0), Action("B", 0)],
    ]  # rank 0 backward first
    with pytest.raises(RuntimeError, match="deadlocks: rank 0 at B0"):
        simulate(lists)


@pytest.mark.parametrize(
    "args,match",
    [
        (("pipedream", 2, 4), "unknown schedule 'pipedream'"),
        (
            ("1f1b", 4, 3),
            r"1f1b needs at least as many micro-batches as stages: --microbatches 3 < --pp 4",
        ),
        (("zb-h1", 4, 2), "zb-h1 needs at least as many micro-batches"),
        (("interleaved-1f1b", 4, 6, 2), "6 is not a multiple of 4"),
        (("interleaved-1f1b", 2, 4, 1), r"needs --chunks ≥ 2"),
        (("1f1b", 2, 4, 2), "--chunks 2 needs --schedule interleaved-1f1b"),
    ],
)
def test_bad_schedules_are_refused(args, match):
    with pytest.raises(ConfigError, match=match):
        build_schedule(*args)
