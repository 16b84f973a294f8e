"""Generation tasks (d3.research.gentasks): the answer read out of generated text, worked shots that agree with their
targets, disjoint splits without the shots; on tiny fake BIG-bench files, plus one test on the fetched ones."""

from __future__ import annotations

import pytest

from d3.research import data, gentasks
from d3.research.data import Example, TaskInfo
from d3.research.gentasks import (
    GENERATION_TASKS,
    GenerationTask,
    answer_text,
    is_correct,
    worked_arithmetic,
    worked_counting,
)
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


def _drawn(task) -> set[str]:
    """Every question one seed of a generated task draws: shots, validation and test."""
    return {ex.input for ex in (*task.shot_examples(), *task.split("validation"), *task.split("test"))}


@pytest.mark.parametrize("name", gentasks.SYNTHETIC_TASKS)
def test_generated_tasks_have_disjoint_seeded_splits_scored_by_their_own_shots(name: str) -> None:
    task = GENERATION_TASKS[name]
    val, test, shots = task.split("validation"), task.split("test"), task.shot_examples()
    v, t, s = ({ex.input for ex in part} for part in (val, test, shots))
    assert len(v) == len(val) and len(t) == len(test)  # no question twice within a split
    assert not (v & t) and not (s & (v | t))  # disjoint as sets of questions
    if name.startswith(("gen_1_digit", "gen_2_by_1")):  # 100 (55), 900 questions: split evenly after the shots
        assert len(val) + len(test) + len(shots) == task.space_size and abs(len(val) - len(test)) <= 1 or \
            (len(val), len(test)) == (task.val_size, task.test_size)
    else:
        assert (len(val), len(test)) == (task.val_size, task.test_size)
    assert [ex.input for ex in task.split("test")] == [ex.input for ex in test]  # seeded: the same every call
    for shot in shots:  # every shot's worked answer states its own target, and scores right
        assert task.score(shot, " " + task.shot_text(shot) + "\n\nQ: next")
        assert task.shot_text(shot) in task.prompt(test[0])
    assert len({shot.target for shot in shots}) == len(shots)
    with pytest.raises(ValueError, match="split 'train'"):
        task.split("train")


@pytest.mark.parametrize("name", gentasks.SYNTHETIC_TASKS)
def test_a_new_seed_draws_fresh_questions_from_a_task_with_room_and_a_task_without_room_says_so(name: str) -> None:
    """The fresh-seed property: a task with room (its stated question space at least 20 times what one seed draws)
    shares under 10% of its shots, validation and test questions with another seed's; a task without room
    (1-digit, 2-by-1-digit arithmetic) is not among the study's tasks, and a new seed redraws its old questions."""
    task = GENERATION_TASKS[name]
    old, new = _drawn(task), _drawn(task.with_seed(1))
    shared = len(old & new) / len(old)
    assert task.space_size > 0 and task.drawn == task.shots + task.val_size + task.test_size
    if task.has_room:
        assert task.space_size >= gentasks.ROOM * task.drawn and name in gentasks.ROOMY_TASKS
        assert len(old) == task.drawn and shared < 0.10, f"{name}: {shared:.1%} of its questions again"
        assert _drawn(task.with_seed(2)) != new  # every seed its own draw
    else:  # the study refuses it, whatever two seeds happen to share
        assert name not in gentasks.ROOMY_TASKS and task.space_size < gentasks.ROOM * task.drawn
    if task.space_size <= task.drawn:  # a space a seed exhausts: every seed draws the same questions
        assert shared == 1.0


def test_the_roomy_tasks_are_the_new_kinds_and_the_old_small_ones_are_not_among_them() -> None:
    roomy = set(gentasks.ROOMY_TASKS)
    assert {"gen_word_problems", "gen_two_step_problems", "gen_copy_list", "gen_reverse_list", "gen_sort_numbers",
            "gen_unit_conversion", "gen_dates", "gen_next_number", "gen_counting", "gen_2_digit_addition_steps",
            "gen_copy_words", "gen_last_word", "gen_compare_numbers"} <= roomy
    assert not roomy & {"gen_1_digit_addition", "gen_1_digit_subtraction", "gen_1_digit_multiplication",
                        "gen_2_by_1_digit_addition", "gen_2_by_1_digit_multiplication"}


def test_a_space_is_drawn_uniformly_over_its_strata_and_its_stated_size_is_what_it_holds() -> None:
    import random

    space = gentasks.Space(((1, lambda rng: ("a", "")), (3, lambda rng: ("b", ""))))  # type: ignore[arg-type]
    rng = random.Random(0)
    share = sum(space.draw(rng)[0] == "b" for _ in range(4000)) / 4000
    assert space.size == 4 and 0.72 < share < 0.78  # a stratum is picked by its size
    one = GENERATION_TASKS["gen_1_digit_addition"]  # drawn until the space is exhausted: exactly what it states
    assert len(_drawn(one)) == one.space_size == 100
    sub = gentasks.arithmetic_space("-", 1)
    assert sub.size == 55
    assert gentasks.list_space("copy", (4, 5, 6)).size == 10 ** 4 + 10 ** 5 + 10 ** 6
    assert gentasks.list_space("sort", (4,)).size == 10 * 9 * 8 * 7
    assert gentasks.word_problem_space(False).size == 12 * 10 * (64 + 36)


def test_generated_questions_have_the_right_answers() -> None:
    import re

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
    for name in ("gen_word_problems", "gen_two_step_problems"):
        for ex in GENERATION_TASKS[name].split("test")[:50]:
            a, *rest = map(int, re.findall(r"\d+", ex.input))
            signs = [1 if "gets" in ex.input else -1] + [-1] * (len(rest) - 1)
            assert int(ex.target) == a + sum(s * r for s, r in zip(signs, rest)) >= 0
    for ex in GENERATION_TASKS["gen_copy_list"].split("test")[:20]:
        assert ex.target == ex.input.split(": ")[1]
    for ex in GENERATION_TASKS["gen_copy_words"].split("test")[:20]:
        assert ex.target == ex.input.split(": ")[1] and len(set(ex.target.split())) == len(ex.target.split())
    for ex in GENERATION_TASKS["gen_last_word"].split("test")[:20]:
        assert ex.target == ex.input.split(": ")[1][:-1].split()[-1]
    for ex in GENERATION_TASKS["gen_compare_numbers"].split("test")[:20]:
        a, b = map(int, re.findall(r"\d+", ex.input))
        assert int(ex.target) == max(a, b) and a != b
    for ex in GENERATION_TASKS["gen_reverse_list"].split("test")[:20]:
        assert ex.target.split() == ex.input.split(": ")[1].split()[::-1]
    for ex in GENERATION_TASKS["gen_sort_numbers"].split("test")[:20]:
        items = ex.input.split(": ")[1].split()
        assert ex.target.split() == sorted(items) and len(set(items)) == len(items)
    for ex in GENERATION_TASKS["gen_unit_conversion"].split("test")[:50]:
        n = int(re.search(r"are in (\d+) ", ex.input).group(1))
        assert int(ex.target) % n == 0 and int(ex.target) // n in (7, 10, 12, 24, 60, 100, 1000)
    for ex in GENERATION_TASKS["gen_dates"].split("test")[:50]:
        k, month, day = re.search(r"date (\d+) days \w+ (\w+) (\d+)\?", ex.input).groups()
        step = int(k) if "after" in ex.input else -int(k)
        assert ex.target == f"{month} {int(day) + step}" and 1 <= int(day) + step <= 28
    for ex in GENERATION_TASKS["gen_next_number"].split("test")[:50]:
        n = int(ex.input.split()[-1][:-1])
        assert int(ex.target) == n + (1 if "after" in ex.input else -1)
