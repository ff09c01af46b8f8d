"""Every case of ``tests/bad_inputs.py``: one line, exit status 2, the value and the fix
named, nothing written — and ``docs/bad-inputs.md`` is that table, as it really prints."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from paracube.cli import main
from paracube.resources import Host
from tests.bad_inputs import CASES, argv_for, prepare

DOC = Path(__file__).resolve().parents[1] / "docs" / "bad-inputs.md"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad-inputs")
    prepare(folder)
    return folder


@pytest.fixture
def tmp(prepared, monkeypatch):
    tmp_path = prepared
    monkeypatch.setattr("paracube.planner.local.DEFAULT_PATH", tmp_path / "calibration.json")
    # The page shows one machine, whatever runs the tests: 2 cores, 24 GiB free, no GPU.
    monkeypatch.setattr(Host, "here", classmethod(lambda cls: Host(2, 24 * 2**30)))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    return tmp_path


def refusal(capsys, argv: list[str]) -> str:
    """The one line ``paracube argv`` prints on stderr, asserting exit 2 and nothing else."""
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own refusals (bad types, unknown commands)
        code = e.code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("paracube: error: ")
    assert out == ""
    return lines[0]


@pytest.mark.parametrize("group,argv,match", CASES, ids=[" ".join(c[1])[:60] for c in CASES])
def test_refused_in_one_line(capsys, tmp, group, argv, match):
    before = sorted(p.name for p in tmp.iterdir())
    line = refusal(capsys, argv_for(argv, tmp))
    assert match.replace("{tmp}", str(tmp)) in line
    assert sorted(p.name for p in tmp.iterdir()) == before  # nothing written or removed


def render(rows: list[tuple[str, list[str], str]]) -> str:
    """The page: one table per group, each row the input and the line it gets."""
    out = [
        "# Bad inputs and what they get",
        "",
        "Every refusal of the command line, as it prints — generated from",
        "`tests/bad_inputs.py` by `PARACUBE_WRITE_DOCS=1 pytest tests/test_bad_inputs.py`",
        "(a test fails when this page and the program disagree). Each is one line on",
        "stderr with exit status 2, before any process starts; nothing is written.",
        "`{tmp}` is a scratch folder with the files the case names; the machine is one of 2",
        "cores and 24 GiB of free memory.",
        "",
        "Failures during a run have their own statuses: 1 a rank failed (a collective timed",
        "out or a peer died: the line names the rank, the peer that stopped answering, the",
        "step and the phase) or the metrics could not be written; 3 training diverged",
        "(`--on-nan stop`); 128 + N a signal (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP).",
    ]
    group = None
    for g, argv, line in rows:
        if g != group:
            out += ["", f"## {g}", "", "| command | refusal |", "|---|---|"]
            group = g
        cell = line.removeprefix("paracube: error: ").replace("|", "\\|")
        shown = " ".join(a if a else "''" for a in argv)
        out.append(f"| `paracube {shown}` | {cell} |")
    return "\n".join(out) + "\n"


def test_the_docs_page_is_the_table(capsys, tmp):
    rows = []
    for group, argv, _ in CASES:
        line = refusal(capsys, argv_for(argv, tmp))
        rows.append((group, argv, re.sub(re.escape(str(tmp)), "{tmp}", line)))
    page = render(rows)
    if os.environ.get("PARACUBE_WRITE_DOCS"):
        DOC.write_text(page)
    assert DOC.read_text() == page, (
        "docs/bad-inputs.md is stale: PARACUBE_WRITE_DOCS=1 pytest tests/test_bad_inputs.py"
    )
