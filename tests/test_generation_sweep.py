"""Generation accuracy (d3.research.sweep.generation, d3.reports.generation, `sweep --task-mode generate`) on a tiny random
Llama: answers scored end to end, one row per setting, resume, the interval, the paper's criterion."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from d3.cli import main as cli_main
from d3.config import FullConfig
from d3.reports.generation import best_within, generation_markdown, headline_lines, matched_table
from d3.research import data, gentasks
from d3.research.data import TaskInfo
from d3.research.gentasks import GenerationTask, worked_arithmetic
from d3.research.sweep import SweepSpec
from d3.research.sweep.generation import GEN_COLUMNS, answer_batch, read_generation, reply, run_generation_sweep, wilson
from tests.bigbench import write_task

QUESTIONS = [{"input": f"What is {a} plus {b}?", "target": str(a + b)} for a in range(1, 5) for b in range(1, 4)]


def register(tmp_path, monkeypatch, questions) -> GenerationTask:
    monkeypatch.setenv("D3_DATA_DIR", str(tmp_path))
    monkeypatch.setitem(data.TASKS, "fake_add", TaskInfo("fake_add", "fake_add", "exact_match", 0.1, "x"))
    write_task(tmp_path, "fake_add", {"examples": questions})
    gentasks._shots_and_rest.cache_clear()
    task = GenerationTask("fake_gen", "fake_add", worked_arithmetic, 5, "x", shots=1, val_size=4)
    monkeypatch.setitem(gentasks.GENERATION_TASKS, "fake_gen", task)
    return task


@pytest.fixture
def task(tmp_path, monkeypatch, engine) -> GenerationTask:
    """A task whose first 4 questions' right answer is what the tiny model states at full depth (so full depth
    scores exactly 4 of 11), the others an answer it never gives."""
    first = register(tmp_path / "probe", monkeypatch, QUESTIONS)
    asked = first.questions()
    stated = [a.stated for a in answer_batch(engine, first, asked, FullConfig())[0]]
    assert all(s.strip() for s in stated[:4]), stated  # the tiny model states something
    # The shot keeps its target (the prompt, and so every answer, stays the same); the questions get new ones.
    targets = {q.input: (s if k < 4 else "never said") for k, (q, s) in enumerate(zip(asked, stated))}
    rewritten = [{"input": q["input"], "target": targets.get(q["input"], q["target"])} for q in QUESTIONS]
    yield register(tmp_path / "task", monkeypatch, rewritten)
    gentasks._shots_and_rest.cache_clear()


def test_wilson_interval_by_hand() -> None:
    low, high = wilson(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)  # the textbook value for 0 of 10
    low, high = wilson(5, 10)
    assert (low, high) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert all(math.isnan(x) for x in wilson(0, 0))


class Step:
    def __init__(self, text: str, token_id: int = 5, n: int = 3) -> None:
        self.text, self.token_id, self.n_layers = text, token_id, n


class FakeTrace:
    def __init__(self, steps) -> None:
        self.steps = steps


def test_reply_ends_at_the_blank_line_or_the_end_of_sequence_token() -> None:
    trace = FakeTrace([Step(" 7"), Step("."), Step("\n"), Step("\nQ", n=9), Step(":", n=9)])
    assert reply(trace, eos_ids={2}) == (" 7.\n\nQ", 4, 18)
    eos = FakeTrace([Step(" 7"), Step("<|im_end|>", token_id=2, n=1), Step(" junk")])
    assert reply(eos, eos_ids={2}) == (" 7", 2, 4)


def test_full_depth_scores_what_it_states(engine, task) -> None:
    answers, timed = answer_batch(engine, task, task.questions(), FullConfig())
    assert sum(a.correct for a in answers) == 4 and timed.seconds > 0
    assert max(a.tokens for a in answers) <= timed.steps <= task.max_new_tokens  # stops once every reply is done
    assert all(a.layers == a.tokens * engine.num_layers for a in answers)


SPEC = dict(prompts=("hello there",), max_new_tokens=5, repeats=1, depths=(0.6,), baselines=("skipdecode", "unified"),
            task_mode="generate", task_limit=11)


def test_generation_sweep_rows_and_resume(engine, task, tmp_path) -> None:
    spec = SweepSpec(tasks=("fake_gen",), **SPEC)
    out = tmp_path / "gen.csv"
    calls = []
    df = run_generation_sweep(spec, out, engine=engine, progress=lambda f, d: calls.append(f))
    assert list(df.columns) == list(GEN_COLUMNS) and list(df["strategy"]) == ["full", "d3", "skipdecode", "unified"]
    full = df.iloc[0]
    assert full["accuracy"] == full["accuracy_full"] == pytest.approx(4 / 11) and full["same_answer"] == 1.0
    assert full["mean_layers"] == engine.num_layers and full["questions"] == 11 and full["timing_batches"] == 1
    assert full["ci_low"] < full["accuracy"] < full["ci_high"] and full["chance"] > 0
    assert full["diff"] == full["diff_low"] == full["diff_high"] == 0.0 and full["same_answer_low"] == 1.0  # itself
    d3 = df.iloc[1]
    assert d3["mean_layers"] < engine.num_layers and d3["theoretical_speedup"] > 1 and d3["measured_speedup"] > 0
    assert d3["step_speedup"] > 0
    assert d3["diff"] == pytest.approx(d3["accuracy"] - d3["accuracy_full"]) and d3["diff_low"] <= d3["diff"] <= d3["diff_high"]
    assert d3["same_answer_low"] <= d3["same_answer"] <= d3["same_answer_high"] <= 1.0
    assert (df["accuracy_full"] == full["accuracy"]).all()
    per_task = json.loads(d3["task_accuracy"])["fake_gen"]
    assert per_task["n"] == 11 and per_task["accuracy"] == pytest.approx(d3["accuracy"])
    assert calls[0] == 0.0 and calls[-1] == 1.0
    again = run_generation_sweep(spec, out, engine=engine)  # every key is in the file: nothing is measured again
    assert len(again) == 4 and out.read_text().count("\n") == 5
    text = generation_markdown(again)
    assert "## Generation accuracy" in text and "Largest measured speedup within 1 point" in text
    from d3.reports import generation as gen_report
    from viz.report import GenerationParts, generation_section

    parts = GenerationParts(gen_report.HEADING, gen_report.headline_lines(again), gen_report.matched_table(again), again)
    html = "".join(generation_section(parts))  # the HTML report's section: criterion, then every setting
    assert "<h2>Generation accuracy" in html and "Largest measured speedup within 1 point" in html
    assert all(label in html for label in again["label"])
    assert html.count("accuracy vs full, points (95%)") == 2  # the curves, by depth and speed


def row(strategy: str, acc: float, speed: float, layers: float, label: str = "") -> dict:
    return {"strategy": strategy, "label": label or f"{strategy} {speed}", "accuracy": acc, "accuracy_full": 0.5,
            "measured_speedup": speed, "mean_layers": layers, "num_layers": 30, "ci_low": acc - 0.05,
            "ci_high": acc + 0.05, "chance": 0.1, "questions": 200, "tasks": "a,b", "target_depth": 1.0,
            "theoretical_speedup_fixed": 1.0, "step_speedup": speed, "same_answer": 1.0, "task_accuracy": "{}"}


def test_the_papers_criterion_takes_the_fastest_setting_within_one_point() -> None:
    df = pd.DataFrame([row("full", 0.5, 1.01, 30), row("d3", 0.495, 1.10, 27), row("d3", 0.49, 1.30, 22),
                       row("d3", 0.489, 1.5, 18), row("d3", 0.52, 1.0, 30), row("skipdecode", 0.30, 1.4, 20)])
    assert best_within(df, "d3")["measured_speedup"] == 1.30  # 0.49 is exactly 1 point below: in; 0.489 is out
    assert best_within(df, "skipdecode") is None
    lines = headline_lines(df)
    assert "1.30x for D3" in lines[1] and "SkipDecode: no setting" in lines[2]
    assert "50.0% [45.0%, 55.0%]" in lines[0] and "10.0%" in lines[0]


def test_the_criterion_reads_the_paired_bound_on_the_loss_when_the_table_has_it() -> None:
    def paired(r: dict, low: float) -> dict:
        return {**r, "diff": r["accuracy"] - 0.5, "diff_low": low, "diff_high": r["accuracy"] - 0.5 + 0.01}

    df = pd.DataFrame([paired(row("full", 0.5, 1.01, 30), 0.0), paired(row("d3", 0.5, 1.10, 27), -0.008),
                       paired(row("d3", 0.5, 1.30, 22), -0.04)])  # same point estimate; only the first is sure
    assert best_within(df, "d3")["measured_speedup"] == 1.10
    table = matched_table(df)
    assert table["vs full, points [paired 95%]"].tolist()[2] == "+0.0 [-4.0, +1.0]"


def test_cli_generate_mode(engine, task, tmp_path, monkeypatch, capsys) -> None:
    from d3.cli import build_parser
    from d3.cli import sweep as sweep_cli

    out = tmp_path / "g.csv"
    args = ["sweep", "--task-mode", "generate", "--tasks", "fake_gen", "--task-limit", "5", "--new-tokens", "5",
            "--repeats", "1", "--depths", "0.6", "--baselines", "", "--out", str(out)]
    assert sweep_cli.main(build_parser().parse_args(args), engine=engine) == 0
    assert list(read_generation(out)["strategy"]) == ["full", "d3"]
    capsys.readouterr()
    assert cli_main(["sweep", "--task-mode", "generate", "--tasks", "word_soup", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tasks" in err[0] and "arithmetic_1_digit_multiplication" in err[0]
    summary = tmp_path / "S.md"
    assert cli_main(["report", "--results", str(out), "--generation", str(tmp_path / "none.csv"),
                     "--summary", str(summary)]) == 2
    assert not summary.exists()  # refused before writing anything
