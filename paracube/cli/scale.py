"""``paracube scale``: the job run at several data-parallel sizes, each point diagnosed —
the speed-up curve and where each point's step went (:mod:`paracube.diagnose.scaling`)."""

from __future__ import annotations

from paracube.errors import ParacubeError


def add_parser(sub) -> None:
    from paracube.cli.train_args import add_arguments

    p = sub.add_parser(
        "scale",
        help="run the job at dp = 1, 2, 4 …: the speed-up curve with each point's breakdown",
        description=(
            "Run the same job (train's flags) at each --points data-parallel size for a few "
            "steps, diagnose each run and print the speed-up curve. Weak scaling: each rank "
            "keeps its --micro-batch (give --global-batch to hold the global batch instead)."
        ),
    )
    s = p.add_argument_group("scaling")
    s.add_argument(
        "--points", default="1,2,4", help="data-parallel sizes, ascending (default 1,2,4)"
    )
    s.add_argument("--plot", default=None, help="write the curve and breakdowns (PNG)")
    s.add_argument(
        "--runs-dir",
        default=None,
        help="keep each point's metrics here as dpN.jsonl (default: a temporary folder)",
    )
    s.add_argument("--json", action="store_true", help="print every point's figures as JSON")
    add_arguments(p)
    p.set_defaults(func=cmd_scale, steps=20, no_progress=True)


def parse_points(text: str) -> list[int]:
    try:
        points = [int(x) for x in text.split(",")]
    except ValueError:
        raise ParacubeError(
            f"--points {text!r}: give data-parallel sizes as N,N,… (1,2,4)"
        ) from None
    if not points or any(p <= 0 for p in points) or points != sorted(set(points)):
        raise ParacubeError(
            f"--points {text}: give distinct positive sizes in ascending order (1,2,4)"
        )
    return points


def cmd_scale(args) -> int:
    import json
    import os
    import shutil
    import tempfile

    from paracube.cli.diagnose import figures_of
    from paracube.cli.train import LocalJob, config_from_args, run_options
    from paracube.diagnose import scaling
    from paracube.outputs import check_output

    points = parse_points(args.points)
    if args.dp != 1:
        raise ParacubeError(
            f"--dp {args.dp}: scale sets the data-parallel size itself; give --points instead"
        )
    if args.metrics is not None:
        raise ParacubeError("--metrics: scale writes one file per point; give --runs-dir instead")
    if args.nnodes != 1:
        raise ParacubeError("--nnodes: scale runs its points on this machine only")
    if args.plot is not None:
        if not args.plot.endswith(".png"):
            raise ParacubeError(f"--plot {args.plot}: the file must end in .png")
        check_output(args.plot, "--plot", "overwrite")
    if args.runs_dir is not None:
        check_output(os.path.join(args.runs_dir, "dp1.jsonl"), "--runs-dir", "overwrite")
    folder = os.path.abspath(args.runs_dir or tempfile.mkdtemp(prefix="paracube-scale-"))
    created = folder  # the top-most folder this command creates (removed if refused)
    while not os.path.exists(os.path.dirname(created)):
        created = os.path.dirname(created)
    if args.runs_dir is not None and os.path.exists(folder):
        created = ""
    os.makedirs(folder, exist_ok=True)
    if args.threads is None:
        # The same threads per rank at every point, so the points differ only in ranks.
        from paracube.resources import usable_cores

        args.threads = max(1, usable_cores() // points[-1])
    run = run_options(args)
    jobs = []
    try:
        for dp in points:  # every point checked before the first starts
            args.dp = dp
            args.metrics = os.path.join(folder, f"dp{dp}.jsonl")
            args.metrics_mode = "overwrite"
            jobs.append((dp, LocalJob(args, config_from_args(args), run)))
    except ParacubeError:
        if created:  # nothing of a refused job is left behind
            shutil.rmtree(created)
        raise
    diagnosed = []
    for dp, job in jobs:
        print(f"paracube scale: dp={dp} …", flush=True)
        status = job.start()
        if status != 0:
            return status
        diagnosed.append((dp, figures_of(job.cfg.metrics or "")))
    rows = scaling.curve(diagnosed)
    if args.plot is not None:
        scaling.draw(rows, args.plot)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        model = jobs[0][1].cfg
        what = (
            f"{model.model.name}, micro-batch {model.micro_batch}, {model.steps} steps per point"
            f", tp={model.parallel.tp} pp={model.parallel.pp}, {args.threads} thread(s) per rank; "
            f"metrics in {folder}"
        )
        print(scaling.text(rows, what))
    return 0
