"""Generation tasks (d3.research.gentasks): the answer read out of generated text, worked shots that agree with their
targets, disjoint splits without the shots; on tiny fake BIG-bench files, plus one test on the fetched ones."""

from __future__ import annotations

import pytest

from d3.research import data, gentasks
from d3.research.data import Example, TaskInfo
from d3.research.gentasks import GENERATION_TASKS, GenerationTask, answer_text, is_correct, worked_arithmetic, worked_counting
from tests.bigbench import write_task


def ex(inp: str, *targets: str) -> Example:
    return Example("t", inp, (), targets[0], None, targets)


@pytest.mark.parametrize("text, stated", [
    (" 3 plus 4 is 7. So the answer is 7.\n\nQ: What", "7"),
    (" 3 plus 4 is 7. So the answer is 7", "7"),
    (" Counting them: a cat (1). So the answer is 1.<|im_end|>", "1.<|im_end|>"),  # engine strips EOS first
    (" so THE ANSWER IS banana split.\nmore", "banana split"),
    (" 12\nSo the answer is 13.", "13"),
    (" 12\n\nQ: x. So the answer is 13.", "12"),  # nothing after the reply counts
    ("", ""),
    (" The sorted list: a b c.", "The sorted list: a b c."),  # never says "answer is": its first line
])
def test_answer_text(text: str, stated: str) -> None:
    assert answer_text(text) == stated


def test_is_correct_accepts_any_target_after_normalizing() -> None:
    q = ex("I have a cat and a dog. How many animals?", "two", "2")
    assert is_correct(q, " a cat (1), a dog (2). So the answer is 2.")
    assert is_correct(q, " So the answer is Two.")
    assert not is_correct(q, " So the answer is 3.") and not is_correct(q, " 2 plus")


def test_worked_answers_state_the_target_last() -> None:
    assert worked_arithmetic(ex("What is 80 plus 29?", "109")) == "80 plus 29 is 109. So the answer is 109."
    assert worked_arithmetic(ex("What is 7 times 8?", "56")).endswith("So the answer is 56.")
    counted = worked_counting(ex("I have a flute, a piano, and a violin. How many musical instruments do I have?",
                                 "three", "3"))
    assert counted == "Counting them: a flute (1), a piano (2), a violin (3). So the answer is 3."
    with pytest.raises(ValueError):  # two cats is not one object: the rule could not write it
        worked_counting(ex("I have a flute, and two cats. How many animals do I have?", "two", "2"))
    with pytest.raises(ValueError):  # a flute and a cat, asked for animals: counting all would say 2, not 1
        worked_counting(ex("I have a flute, and a cat. How many animals do I have?", "one", "1"))
    with pytest.raises(ValueError):
        worked_arithmetic(ex("Sort these words", "a b"))


ADD = {"examples": [{"input": f"What is {a} plus {b}?", "target": str(a + b)} for a in range(1, 6) for b in range(1, 5)]}


@pytest.fixture
def fake_task(tmp_path, monkeypatch) -> GenerationTask:
    monkeypatch.setenv("D3_DATA_DIR", str(tmp_path))
    monkeypatch.setitem(data.TASKS, "fake_add", TaskInfo("fake_add", "fake_add", "exact_match", 0.1, "x"))
    write_task(tmp_path, "fake_add", ADD)
    gentasks._shots_and_rest.cache_clear()
    yield GenerationTask("fake_gen", "fake_add", worked_arithmetic, 16, "x", shots=2, val_size=5)
    gentasks._shots_and_rest.cache_clear()


def test_splits_are_disjoint_and_leave_out_the_shots(fake_task: GenerationTask) -> None:
    shots, val, test = fake_task.shot_examples(), fake_task.split("validation"), fake_task.split("test")
    assert (len(shots), len(val), len(test)) == (2, 5, 13)
    inputs = [e.input for e in (*shots, *val, *test)]
    assert len(set(inputs)) == 20  # every question once
    assert fake_task.questions(7) == val + test[:2] and fake_task.split("validation") == val  # stable


def test_prompt_is_the_worked_shots_then_the_question(fake_task: GenerationTask) -> None:
    q = fake_task.split("test")[0]
    blocks = fake_task.prompt(q).split("\n\n")
    assert len(blocks) == 3 and blocks[-1] == f"Q: {q.input}\nA:"
    for block, shot in zip(blocks, fake_task.shot_examples()):
        assert block.endswith(f"So the answer is {shot.target}.") and shot.input in block
    assert fake_task.score(q, f" So the answer is {q.target}.\n\nQ: next")


def test_chance_is_the_most_common_answer(fake_task: GenerationTask) -> None:
    qs = fake_task.questions()
    top = max(set(e.target for e in qs), key=[e.target for e in qs].count)
    assert fake_task.chance(qs) == pytest.approx([e.target for e in qs].count(top) / len(qs))


def test_unknown_generation_task() -> None:
    with pytest.raises(ValueError, match="not a generation task"):
        gentasks.get_generation_task("nope")
    assert set(gentasks.DEFAULT_GENERATION_TASKS) <= set(GENERATION_TASKS)


@pytest.mark.data
def test_real_tasks_have_worked_shots_that_agree_with_their_targets() -> None:
    real = [t for t in GENERATION_TASKS.values() if t.source in data.TASKS]  # the generated tasks are tested above
    missing = [t.source for t in real if not data.task_file(data.TASKS[t.source].path).is_file()]
    if missing:
        pytest.skip(f"BIG-bench data not fetched (run `python -m d3 fetch-data`); missing {missing}")
    for task in real:
        shots = task.shot_examples()
        assert len(shots) == task.shots, task.name
        for shot in shots:
            assert is_correct(shot, " " + task.worked(shot)), task.name  # a shot's worked answer scores as right
        qs = task.questions()
        assert len(qs) >= 90 and not set(shots) & set(qs), task.name


@pytest.mark.parametrize("name", gentasks.SYNTHETIC_TASKS)
def test_generated_tasks_have_disjoint_seeded_splits_scored_by_their_own_shots(name: str) -> None:
    task = GENERATION_TASKS[name]
    val, test, shots = task.split("validation"), task.split("test"), task.shot_examples()
    v, t, s = ({ex.input for ex in part} for part in (val, test, shots))
    assert len(v) == len(val) and len(t) == len(test)  # no question twice within a split
    assert not (v & t) and not (s & (v | t))  # disjoint as sets of questions
    if name.startswith(("gen_1_digit", "gen_2_by_1")):  # 100 (55), 900 questions: split evenly after the shots
        assert len(val) >= 26 and abs(len(val) - len(test)) <= 1 and len(val) + len(test) + len(shots) in (55, 100, 900)
    else:
        assert len(val) >= 500 and len(test) >= 500
    assert [ex.input for ex in task.split("test")] == [ex.input for ex in test]  # seeded: the same every call
    for shot in shots:  # every shot's worked answer states its own target, and scores right
        assert task.score(shot, " " + task.worked(shot) + "\n\nQ: next")
    assert len({shot.target for shot in shots}) == len(shots)
    with pytest.raises(ValueError, match="split 'train'"):
        task.split("train")


def test_generated_questions_have_the_right_answers() -> None:
    for ex in GENERATION_TASKS["gen_2_digit_multiplication"].split("test")[:50]:
        a, _, b = ex.input[len("What is "):-1].split()
        assert int(ex.target) == int(a) * int(b) and 10 <= int(a) <= 99
    for ex in GENERATION_TASKS["gen_2_by_1_digit_multiplication"].split("test")[:50]:
        a, _, b = ex.input[len("What is "):-1].split()
        assert int(ex.target) == int(a) * int(b) and 10 <= int(a) <= 99 and 0 <= int(b) <= 9
    for ex in GENERATION_TASKS["gen_2_digit_subtraction"].split("test")[:50]:
        assert int(ex.target) >= 0
    for ex in GENERATION_TASKS["gen_word_sorting"].split("test")[:50]:
        words = ex.input.split("List: ")[1].split()
        assert ex.target == " ".join(sorted(words))
    for ex in GENERATION_TASKS["gen_counting"].split("test")[:50]:
        assert int(ex.target) == len(gentasks._items(ex.input))
