"""An explicit pipeline layout, in Megatron-Core's grammar (pure text; no model needed).

Megatron-Core cuts a model into pipeline stages by a layout string when one is given
(``--pipeline-model-parallel-layout``; megatron/core/transformer/
pipeline_parallel_layer_layout.py): the virtual stages in order, separated by ``|``, each a
run of units — ``E`` the embedding, ``t`` a transformer block, ``m`` a multi-token
prediction module, ``L`` the final norm, the head and the loss. ``x*n`` repeats a unit,
``(…)*n`` a group, and commas are only for the eye. Virtual stage k runs on pipeline rank
k mod pp, so a layout of S stages fixes pp × chunks = S.

DeepSeek-V3's 61 blocks on H100s are cut so (Megatron-Bridge,
``scripts/performance/configs/deepseek/deepseek_workload_base_configs.py``, PP 8 × VP 4):
the embedding and one block first, thirty stages of two blocks, and the multi-token
prediction module and the loss alone last — a cut no even split can make.

>>> stages_of("Et|(tt|)*2,mL")
('Et', 'tt', 'tt', 'mL')
>>> stages_of("Et*3|t*2L")
('Ettt', 'ttL')
"""

from __future__ import annotations

import functools
import re

from paracube.choices import PIPELINE_SPLIT
from paracube.errors import ConfigError

UNITS = {
    "E": "the embedding",
    "t": "a block",
    "m": "a multi-token prediction module",
    "L": "the final norm, the head and the loss",
}
_GRAMMAR = (
    "write Megatron's layout (E the embedding, t a block, m a multi-token prediction module, "
    "L the loss, | between stages, x*n or (…)*n to repeat; e.g. 'Et|(tt|)*30mL') or one of "
    + ", ".join(PIPELINE_SPLIT)
)
_REPEAT = re.compile(r"\*(\d+)")


def is_layout(split: str) -> bool:
    """Whether a pipeline split is an explicit layout rather than one of the named splits."""
    return split not in PIPELINE_SPLIT


@functools.cache
def stages_of(text: str) -> tuple[str, ...]:
    """The virtual stages ``text`` names, each its units in order, repetitions unrolled
    (a :class:`ConfigError` naming the text and the grammar when it is not a layout; a
    lower-case word is taken for a misspelt name)."""
    if re.fullmatch(r"[a-z-]+", text):
        raise ConfigError(
            f"unknown --pipeline-split {text!r}: choose one of {', '.join(PIPELINE_SPLIT)}, or "
            "write an explicit layout in Megatron's grammar (E the embedding, t a block, m a "
            "multi-token prediction module, L the loss, | between stages; e.g. 'Et|(tt|)*30mL')"
        )
    try:
        flat = _unroll(text.replace(",", "").replace(" ", ""))
    except ValueError as why:
        raise ConfigError(f"--pipeline-split {text!r}: {why}; {_GRAMMAR}") from None
    unknown = sorted(set(flat) - set(UNITS) - {"|"})
    if unknown:
        raise ConfigError(
            f"--pipeline-split {text!r}: {', '.join(map(repr, unknown))} is no unit; {_GRAMMAR}"
        )
    stages = tuple(flat.split("|"))
    units = "".join(stages)
    if units.count("E") != 1 or not units.startswith("E"):
        raise ConfigError(
            f"--pipeline-split {text!r}: the embedding (E) comes once, first; {_GRAMMAR}"
        )
    if units.count("L") != 1 or not units.endswith("L"):
        raise ConfigError(f"--pipeline-split {text!r}: the loss (L) comes once, last; {_GRAMMAR}")
    if "m" in units and "t" in units[units.find("m") :]:
        raise ConfigError(
            f"--pipeline-split {text!r}: the multi-token prediction modules (m) come after "
            "every block (t), as Megatron-Core requires"
        )
    return stages


def _unroll(text: str) -> str:
    """``text`` with every ``x*n`` and ``(…)*n`` written out (groups may nest)."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "(":
            depth, j = 1, i + 1
            while j < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            if depth:
                raise ValueError("a '(' is not closed")
            piece, i = _unroll(text[i + 1 : j - 1]), j
        elif text[i] in ")*":
            raise ValueError(f"a {text[i]!r} stands where a unit or '(' should")
        else:
            piece, i = text[i], i + 1
        repeat = _REPEAT.match(text, i)
        if repeat:
            piece, i = piece * int(repeat.group(1)), repeat.end()
        out.append(piece)
    return "".join(out)


def layout_refusal(stages: tuple[str, ...], blocks: int, mtp_layers: int) -> str:
    """Why a model of ``blocks`` blocks and ``mtp_layers`` multi-token prediction modules
    cannot take the layout ``stages`` ("" if it can): every block once, every module once,
    and — as the planner times them — the modules beside the loss."""
    units = "".join(stages)
    if units.count("t") != blocks:
        return (
            f"the pipeline layout holds {units.count('t')} blocks (t) and the model has "
            f"{blocks}: name each block once"
        )
    if units.count("m") != mtp_layers:
        return (
            f"the pipeline layout holds {units.count('m')} multi-token prediction modules (m) "
            f"and the model has {mtp_layers}: name each once"
        )
    loss_stage = next(stage for stage in stages if "L" in stage)
    if loss_stage.count("m") != mtp_layers:
        return (
            "the multi-token prediction modules (m) stand apart from the loss (L): the planner "
            "times them in the loss's stage; put them there"
        )
    return ""
