"""``paracube diagnose RUN``: where a run's scaling went, with the fix."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "diagnose",
        help="where a run's time went: speed-up, a breakdown per rank, the causes and their fixes",
        description="Diagnose a run from its --metrics file (every rank's timings of every step).",
    )
    p.add_argument("run", help="the run's --metrics file (or a folder holding one)")
    p.add_argument(
        "--baseline", default=None, help="a one-rank run of the same model: measured speed-up"
    )
    p.add_argument(
        "--no-calibrate",
        action="store_true",
        help="skip timing the model at a larger micro-batch (small-batch loss not measured)",
    )
    p.add_argument("--json", action="store_true", help="print every figure as JSON")
    p.add_argument("--plot", default=None, help="write per-rank bars and one step's timeline (PNG)")
    p.add_argument("--trace", default=None, help="write one step as a Chrome/Perfetto trace (JSON)")
    p.set_defaults(func=cmd_diagnose)


def cmd_diagnose(args) -> int:
    print(
        diagnose(args.run, args.baseline, not args.no_calibrate, args.json, args.plot, args.trace)
    )
    return 0


def diagnose(
    path: str,
    baseline: str | None = None,
    calibrate: bool = True,
    as_json: bool = False,
    plot: str | None = None,
    trace: str | None = None,
) -> str:
    """The diagnosis of the run at ``path`` as text (or JSON), with its pictures written."""
    import json

    from paracube.diagnose import report
    from paracube.diagnose.records import DiagnoseError, read_run
    from paracube.outputs import check_output

    for flag, out, end in (("--plot", plot, ".png"), ("--trace", trace, ".json")):
        if out is not None:
            if not out.endswith(end):
                raise DiagnoseError(f"{flag} {out}: the file must end in {end}")
            check_output(out, flag, "overwrite")
    run = read_run(path)
    if trace is not None and run.timeline is None:
        raise DiagnoseError(f"{path} recorded no step timeline: re-run it with this version")
    figures = figures_of(path, baseline, calibrate, run)
    breakdown = figures.pop("_breakdown")
    if plot is not None:
        from paracube.diagnose.pictures import draw

        draw(breakdown, run.timeline, plot)
    if trace is not None and run.timeline is not None:  # checked above
        from paracube.diagnose.pictures import chrome_trace

        chrome_trace(run.timeline, trace)
    if as_json:
        return json.dumps(figures, indent=1)
    figures["_breakdown"] = breakdown
    return report.text(figures)


def figures_of(path: str, baseline: str | None = None, calibrate: bool = False, run=None) -> dict:
    """Every figure of the run at ``path`` (``--json``'s, and its ``_breakdown``):
    against a one-rank ``baseline`` run if given, the small-batch loss measured if
    ``calibrate``, the planner's prediction if this machine is calibrated."""
    from paracube.diagnose import report
    from paracube.diagnose.prediction import planner_prediction
    from paracube.diagnose.records import read_run

    run = run or read_run(path)
    base = read_run(baseline) if baseline is not None else None
    if base is not None:
        report.check_baseline(run, base)
    fraction = None
    header = run.header
    if calibrate and header.get("model") and header.get("micro_batch"):
        from paracube.diagnose.efficiency import small_batch_fraction

        fraction = small_batch_fraction(
            header["model"],
            header["micro_batch"],
            header["model"]["seq_len"],
            header.get("threads", 1),
        )
    return report.figures(run, base, fraction, planner_prediction(header))
