"""The options of a run that are not what is trained: checkpoints, and how this machine runs
the ranks. Kw-only dataclasses checking each value on its own, as in :mod:`paracube.config`
(whose ``TrainConfig.checkpoint`` is a :class:`CheckpointConfig`); torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field

from paracube.errors import ConfigError
from paracube.inject import Injections
from paracube.values import MAX_TIMEOUT_S, number, positive


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Where and how often a run saves (:mod:`paracube.checkpoint`), and what it resumes.

    ``save_dir``: the folder of ``step-N`` checkpoints; ``every``: save after every N-th
    step (and after the last); ``keep_last``: keep only the newest K; ``resume``: a
    checkpoint folder, or ``"auto"`` for the newest complete one in ``save_dir``;
    ``init_from``: a ``paracube export`` file to take the weights from (step 0)."""

    save_dir: str | None = None
    every: int | None = None
    keep_last: int | None = None
    resume: str | None = None
    init_from: str | None = None  # exported weights (safetensors) to start from
    async_save: bool = False  # write in the background while training goes on

    def __post_init__(self) -> None:
        if self.resume is not None and self.init_from is not None:
            raise ConfigError(
                "--resume and --init-from both set where the weights come from: give only one"
            )
        if self.every is not None:
            positive("--save-every", self.every)
            if self.save_dir is None:
                raise ConfigError("--save-every needs --save-dir: the folder the checkpoints go to")
        if self.keep_last is not None:
            positive("--keep-last", self.keep_last, "the newest K checkpoints are kept")
            if self.save_dir is None:
                raise ConfigError("--keep-last needs --save-dir")
        if self.async_save and self.save_dir is None:
            raise ConfigError("--async-save needs --save-dir")
        if self.save_dir is not None and not self.save_dir.strip():
            raise ConfigError("--save-dir is empty: give a folder")
        if self.resume is not None and not self.resume.strip():
            raise ConfigError("--resume is empty: give a checkpoint folder or auto")


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How this machine runs a job's ranks — not part of what is trained.

    ``threads``: torch threads per rank (None: cores ÷ local ranks); ``timeout_s``: how
    long a collective may wait before the job fails; ``oversubscribe``: allow more local
    ranks (or threads) than this machine's limits (:mod:`paracube.resources`);
    ``predict``: print the planner's prediction beside the measured step;
    ``max_restarts``: how often the launcher restarts the ranks after a failure, each time
    from the newest checkpoint in ``--save-dir``; ``profile``: the steps traced by the
    torch profiler into ``profile_dir`` (:mod:`paracube.profiling`)."""

    threads: int | None = None
    timeout_s: float = 300.0
    oversubscribe: bool = False
    predict: bool = False
    max_restarts: int = 0  # restarts of the local ranks after a failure (from the last checkpoint)
    inject: Injections = field(default_factory=Injections)  # faults for tests and demos
    profile: tuple[int, int] | None = None  # first and last step traced by the torch profiler
    profile_dir: str = "runs/profile"  # where the traces go (rank{r}-step{s}.json)

    def __post_init__(self) -> None:
        if self.threads is not None:
            positive("--threads", self.threads)
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int):
            raise ConfigError(f"--max-restarts must be an integer, got {self.max_restarts!r}")
        if not 0 <= self.max_restarts <= 100:
            raise ConfigError(f"--max-restarts must be in [0, 100], got {self.max_restarts}")
        number("--timeout", self.timeout_s, low=0, high=MAX_TIMEOUT_S, open_low=True)
