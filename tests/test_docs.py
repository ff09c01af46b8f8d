"""The examples in the public API's docstrings run as written (doctest)."""

import doctest
import importlib

import pytest

# Modules whose examples need no process group (the distributed ones are shown in the
# README and exercised by the parity tests).
DOCUMENTED = [
    "paracube.choices",
    "paracube.config",
    "paracube.planner.megatron",
    "paracube.planner.layout",
    "paracube.planner.search",
    "paracube.planner.report",
    "paracube.planner.reasons",
    "paracube.planner.mixed",
    "paracube.cli.plan_mixed",
    "paracube.planner.time_model",
    "paracube.planner.dp_comm",
    "paracube.planner.mp_comm",
    "paracube.planner.stacks",
    "paracube.planner.stages",
    "paracube.planner.pipeline_layout",
    "paracube.planner.published",
    "paracube.pipeline.schedules",
    "paracube.mesh.layout",
    "paracube.data_parallel.ddp",
    "paracube.models.spec",
]


@pytest.mark.parametrize("name", DOCUMENTED)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0, f"{name} has no examples to run"
    assert result.failed == 0


def test_readme_examples_run():
    """The README's interactive (``>>>``) snippets, each fenced block run as written."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if ">>> " in b]
    assert blocks, "the README has no interactive examples"
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner()
    for i, block in enumerate(blocks):
        runner.run(parser.get_doctest(block, {}, f"README block {i}", "README.md", 0))
    assert runner.summarize(verbose=False).failed == 0
