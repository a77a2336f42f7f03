"""Progress that moves: the search reports each labelled phase, and the timing per block
of rows, through a callback (planner.progress); the CLI draws one bar per phase."""

import math

import pytest

from planner import api

QUERY = dict(model="llama3-8b", seq_len=4096, global_batch_tokens=2**22)


def _calls(monkeypatch, block_rows):
    import planner.evaluate

    monkeypatch.setattr(planner.evaluate, "TIMED_BLOCK_ROWS", block_rows)
    calls = []
    job = api.build_job(**QUERY)
    result, _table = api.plan(
        job, "dgx-h100", 64, api.build_search_space(), top=1,
        progress=lambda *call: calls.append(call),
    )  # fmt: skip
    return calls, result


def test_search_reports_every_phase_in_order_with_counts_that_only_grow(monkeypatch):
    calls, result = _calls(monkeypatch, 2**17)
    phases = list(dict.fromkeys(phase for phase, _, _ in calls))
    assert phases == list(api.PROGRESS_PHASES)
    for phase in phases:
        done = [d for p, d, _ in calls if p == phase]
        totals = {t for p, _, t in calls if p == phase and t}  # 0: not known yet
        assert done == sorted(done) and done[0] == 0 and len(totals) == 1
        assert done[-1] == totals.pop()  # each phase ends complete
    enumerated = [t for p, _, t in calls if p == "enumerating layouts"][-1]
    assert enumerated == result.candidates_evaluated


def test_timing_advances_once_per_block_of_rows(monkeypatch):
    calls, _ = _calls(monkeypatch, 97)
    timing = [(d, t) for p, d, t in calls if p == "timing"]
    total = timing[0][1]
    assert total > 3 * 97  # several blocks
    assert len(timing) == 1 + math.ceil(total / 97)
    assert [d for d, _ in timing[1:-1]] == [97 * k for k in range(1, len(timing) - 1)]


def test_cli_bar_has_one_task_per_phase_with_its_rate(monkeypatch):
    import sys

    from commands.plan import _progress

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with _progress(True) as advance:
        assert advance is not None
        advance("timing", 0, 1000)
        advance("timing", 500, 1000)
        bar = advance.__self__.bar
        (task,) = bar.tasks
        assert task.completed == 500 and task.total == 1000 and task.fields["unit"] == "rows"
        advance("simulating the top rows", 0, 20)
        assert bar.tasks[0].finished and bar.tasks[1].total == 20


@pytest.mark.parametrize("phase", list(api.PROGRESS_PHASES))
def test_every_phase_names_its_unit(phase):
    assert api.PROGRESS_PHASES[phase] in ("rows", "layouts")
