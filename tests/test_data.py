"""Tests for d3.research.data: task parsing on tiny fake task.json files; one test on the real fetched data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from d3.research import data
from d3.research.data import Example, TaskInfo
from tests.bigbench import write_task

MC = {
    "task_prefix": "Answer the question.\n",
    "example_input_prefix": "\nStatement: ",
    "examples": [
        {"input": "The sky is green", "target_scores": {"plausible": 0, "implausible": 1}},
        {"input": "Which date?", "target_scores": {"01/01/2020": 1, "02/02/2020": 0, "03/03/2020": 0, "04/04/2020": 0}},
        {"input": "Two right answers", "target_scores": {"x": 0, "y": 1, "z": 1}},
    ] + [{"input": f"q{i}", "target_scores": {"yes": 1, "no": 0}} for i in range(7)],
}
EXACT = {
    "task_prefix": "Count.",
    "examples": [
        {"input": "I have a cat and a dog. How many animals?", "target": ["two", "2"]},
        {"input": "I have a cat. How many animals?", "target": "one"},
        {"input": "I have two cats. How many animals?", "target": ["two", "2"]},
    ],
}


@pytest.fixture
def fake_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data dir holding two fake tasks, registered in TASKS as "fake_mc" and "fake_exact"."""
    monkeypatch.setitem(data.TASKS, "fake_mc", TaskInfo("fake_mc", "fake/mc", "multiple_choice", 0.475, "mc"))
    monkeypatch.setitem(data.TASKS, "fake_exact", TaskInfo("fake_exact", "fake_exact", "exact_match", 2 / 3, "x"))
    write_task(tmp_path, "fake/mc", MC)
    write_task(tmp_path, "fake_exact", EXACT)
    return tmp_path


def test_load_multiple_choice(fake_dir: Path) -> None:
    examples = data.load_task("fake_mc", data_dir=fake_dir)
    assert len(examples) == 10
    first, second = examples[:2]
    assert first.task == "fake_mc"
    assert first.input == "Answer the question.\nStatement: The sky is green"
    assert sorted(first.choices) == ["implausible", "plausible"]
    assert first.target == "implausible" and first.choices[first.target_index] == "implausible"
    assert len(second.choices) == 4 and second.choices[second.target_index] == "01/01/2020"
    assert examples[2].target == "y" and examples[2].targets == ("y", "z")
    with pytest.raises(AttributeError):
        first.target = "x"  # type: ignore[misc]  # frozen


def test_choice_order_is_shuffled_but_deterministic(fake_dir: Path) -> None:
    runs = [data.load_task("fake_mc", data_dir=fake_dir, seed=s) for s in range(6)]
    assert runs[0] == data.load_task("fake_mc", data_dir=fake_dir, seed=0)
    # the file lists the answer first; the options shown must not always keep it there
    assert {run[1].target_index for run in runs} != {0}


def test_load_exact_match(fake_dir: Path) -> None:
    examples = data.load_task("fake_exact", data_dir=fake_dir)
    assert [ex.choices for ex in examples] == [(), (), ()]
    assert examples[0].target == "two" and examples[0].targets == ("two", "2")
    assert examples[0].target_index is None
    assert examples[1].targets == ("one",)
    assert examples[0].input.startswith("Count.\nI have a cat")


def test_chance_level(fake_dir: Path) -> None:
    mc = data.load_task("fake_mc", data_dir=fake_dir)
    assert data.chance_level(mc) == pytest.approx((8 * 0.5 + 0.25 + 1 / 3) / 10)
    # exact match: the share of examples answered by always giving the most common answer ("two")
    assert data.chance_level(data.load_task("fake_exact", data_dir=fake_dir)) == pytest.approx(2 / 3)
    assert data.chance_level([]) == 0.0
    assert data.chance_level("fake_mc") == 0.475


def test_subsampling_is_deterministic(fake_dir: Path) -> None:
    a = data.load_task("fake_mc", data_dir=fake_dir, limit=4, seed=7)
    assert a == data.load_task("fake_mc", data_dir=fake_dir, limit=4, seed=7)
    assert len(a) == 4 and len(set(a)) == 4
    others = [data.load_task("fake_mc", data_dir=fake_dir, limit=4, seed=s) for s in range(5)]
    assert len({tuple(ex.input for ex in o) for o in others}) > 1
    assert len(data.load_task("fake_mc", data_dir=fake_dir, limit=100)) == 10


def test_format_prompt() -> None:
    ex = Example("t", "Is it so?", ("yes", "no"), "yes", 0, ("yes",))
    shot = Example("t", "Is 2 even?", ("no", "yes"), "yes", 1, ("yes",))
    prompt = data.format_prompt(ex)
    assert prompt == "Q: Is it so?\nOptions: yes; no\nA:"
    assert data.format_answer("yes") == " yes"
    few = data.format_prompt(ex, few_shot=[shot])
    assert few == "Q: Is 2 even?\nOptions: no; yes\nA: yes\n\n" + prompt
    assert data.format_prompt(ex, few_shot=[shot], show_choices=False) == "Q: Is 2 even?\nA: yes\n\nQ: Is it so?\nA:"
    exact = Example("t", "Sort: b a", (), "a b", None, ("a b",))
    assert data.format_prompt(exact) == "Q: Sort: b a\nA:"


@pytest.mark.parametrize("generated, ok", [
    (" Two.\nQ: next question", True), ("2", True), ("TWO!", True), ("\n\n  two  ", True),
    ("three", False), ("two cats", False), ("", False),
])
def test_score_exact(generated: str, ok: bool) -> None:
    ex = Example("object_counting", "How many?", (), "two", None, ("two", "2"))
    assert data.score_exact(ex, generated) is ok


def test_normalize() -> None:
    assert data.normalize("  Apple,  banana.\nsecond line") == "apple banana"
    assert data.normalize("05/01/2021") == "05012021"


def test_missing_data_dir_says_how_to_fetch(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"bash scripts/fetch_data\.sh.*python -m d3 fetch-data"):
        data.load_task("general_knowledge", data_dir=tmp_path / "nowhere")


def test_unknown_task(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="task='nope'"):
        data.load_task("nope", data_dir=tmp_path)
    with pytest.raises(ValueError, match="tasks="):
        data.fetch(["nope"], data_dir=tmp_path)


def test_fetch_is_a_no_op_when_files_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for path in [i.path for i in data.TASKS.values()] + list(data.TEXT_SOURCES.values()):
        write_task(tmp_path, path, MC)
    monkeypatch.setattr(data.subprocess, "run", lambda *a, **k: pytest.fail("must not download"))
    assert data.fetch(data_dir=tmp_path) == tmp_path


def test_tasks_registry() -> None:
    for name, info in data.TASKS.items():
        assert info.name == name and info.kind in ("multiple_choice", "exact_match")
        assert 0.0 <= info.chance < 1.0 and info.summary
    assert set(data.DEFAULT_TASKS) <= set(data.TASKS)
    for name in data.DEFAULT_TASKS:  # picked because the embedded model is above chance on them
        info = data.TASKS[name]
        assert info.smollm2 is not None and info.smollm2 > info.chance + 0.05 and info.smollm2_n >= 50


def test_ppl_text_is_real_shipped_text() -> None:
    text = data.ppl_text()
    assert 2000 <= len(text.encode()) <= 4096
    assert not text.startswith("#")
    header = (data.ASSETS / "ppl_text.txt").read_text(encoding="utf-8").splitlines()[0]
    assert header.startswith("# Source:")
    topics = pytest.importorskip("pydoc_data.topics").topics
    if not topics.get("objects", "").startswith("Objects, values and types"):
        pytest.skip(f"this Python {sys.version.split()[0]} ships a different reference text")
    assert text.split("\n\n")[2] in topics["objects"]  # verbatim from the Python Language Reference


def test_prompts_asset() -> None:
    raw = json.loads((data.ASSETS / "prompts.json").read_text(encoding="utf-8"))
    assert len(raw) >= 6 and all(set(p) == {"title", "prompt"} and p["title"] and p["prompt"] for p in raw)
    prompts = data.example_prompts()
    assert [(p.title, p.prompt) for p in prompts] == [(p["title"], p["prompt"]) for p in raw]


@pytest.mark.data
def test_real_data() -> None:
    """On the fetched BIG-bench files: every task loads, with the chance level TASKS records."""
    missing = [n for n, i in data.TASKS.items() if not data.task_file(i.path).is_file()]
    if missing:
        pytest.skip(f"BIG-bench data not fetched (run `bash scripts/fetch_data.sh`); missing {missing}")
    for name, info in data.TASKS.items():
        examples = data.load_task(name)
        assert len(examples) >= 50, name
        assert data.chance_level(examples) == pytest.approx(info.chance, abs=0.0005), name
        for ex in examples:
            if info.kind == "multiple_choice":
                assert len(ex.choices) >= 2 and ex.choices[ex.target_index] == ex.target
            else:
                assert not ex.choices and ex.target and ex.target_index is None
        assert data.format_prompt(examples[0]).endswith("\nA:")
    assert len(data.ppl_text().split()) > 100  # the shipped prose for perplexity, header removed
