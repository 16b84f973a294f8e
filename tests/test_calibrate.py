"""Calibrated drop orders: the config's order, the nested schedule, the greedy signals and the CLI."""

from __future__ import annotations

import json

import pytest

from d3.config import D3Config, StaticSkipConfig
from d3.schedule import d3_budget, d3_layers, plan

ORDER_8 = (4, 2, 6, 1, 5, 3)  # flex layers 1..6 of 8 with core 1+1


# ---------------------------------------------------------------- config and schedule (pure)


def test_calibrated_needs_an_order_and_names_what_is_wrong():
    with pytest.raises(ValueError, match="layer_order"):
        D3Config(drop_order="calibrated")
    with pytest.raises(ValueError, match="only read then"):
        D3Config(drop_order="bottom_up", layer_order=(1, 2))
    cfg = D3Config(drop_order="calibrated", layer_order=[4, 2, 6, 1, 5, 3], core_head=1, core_tail=1)
    assert cfg.layer_order == ORDER_8  # a list (JSON, keyword callers) is kept as a tuple
    cfg.check_layers(8)
    bad = D3Config(drop_order="calibrated", layer_order=(4, 2, 6, 1, 7, 7), core_head=1, core_tail=1)
    with pytest.raises(ValueError) as err:
        bad.check_layers(8)
    message = str(err.value)
    assert "1..6" in message and "missing [3, 5]" in message and "not flex layers [7]" in message
    assert "repeated [7]" in message and "\n" not in message
    with pytest.raises(ValueError, match="resolve it"):
        D3Config(drop_order="calibrated", layer_order="agreement", core_head=1, core_tail=1).check_layers(8)


def test_schedule_with_an_explicit_order_is_nested_and_drops_in_that_order():
    cfg = D3Config(alpha=0.8, drop_order="calibrated", layer_order=ORDER_8, core_head=1, core_tail=1)
    previous = set(range(8))
    dropped_so_far: list[int] = []
    for step in range(12):
        run = set(plan(cfg, 8, step).run)
        assert run <= previous  # nested: a layer once dropped never runs again
        dropped_so_far += [x for x in ORDER_8 if x in previous - run]
        previous = run
    assert dropped_so_far == list(ORDER_8)  # dropped exactly in the given order
    for budget in range(2, 9):
        kept = set(d3_layers(cfg, 8, budget))
        assert kept == set(range(8)) - set(ORDER_8[:8 - budget])
    assert d3_budget(cfg, 8, 100) == 2


def test_static_skip_runs_the_same_layers_after_the_first_token():
    cfg = StaticSkipConfig(skip=[3, 1])
    assert cfg.skip == (3, 1)
    assert plan(cfg, 6, 0).run == tuple(range(6))
    assert plan(cfg, 6, 5).run == (0, 2, 4, 5)
    with pytest.raises(ValueError, match="skip"):
        StaticSkipConfig(skip=(1, 1))
    with pytest.raises(ValueError, match="at least one"):
        StaticSkipConfig(skip=(0, 1)).check_layers(2)


def test_greedy_order_is_nested_and_records_the_curve():
    from d3.research.calibrate import Score, greedy_order

    harm = {1: 0.05, 2: 0.3, 3: 0.01, 4: 0.2}
    calls = []

    def score(removed):
        calls.append(removed)
        return Score(1 - sum(harm[x] for x in removed) - 0.1 * (removed[-1] == 4 and 3 in removed))

    order, single, curve = greedy_order([1, 2, 3, 4], score, higher=True, steps=2)
    assert order[:2] == (3, 1) and order[2:] == (4, 2)  # greedy twice, then by single-drop score
    assert {k: round(v.value, 3) for k, v in single.items()} == {1: 0.95, 2: 0.7, 3: 0.99, 4: 0.8}
    assert [round(s.value, 3) for s in curve] == [0.99, 0.94]
    assert all(c[:-1] == (3,) for c in calls[4:])  # the second step builds on the first removal


# ---------------------------------------------------------------- the signals on a tiny model


@pytest.fixture(scope="module")
def identity_engine(tiny_tok):
    """8 layers; layer 4's attention output and MLP down projections are zero, so it is the identity."""
    import torch

    from d3.engine import Engine
    from tests.tiny import tiny_llama

    model = tiny_llama(num_layers=8, seed=3)
    with torch.no_grad():
        model.model.layers[4].self_attn.o_proj.weight.zero_()
        model.model.layers[4].mlp.down_proj.weight.zero_()
    return Engine(model, tiny_tok, name="tiny-identity")


@pytest.fixture()
def cache_dir(tmp_path, monkeypatch):
    from d3.research.calibrate import CALIBRATION_ENV

    monkeypatch.setenv(CALIBRATION_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


PROMPTS = ("hello there, how are you", "the cat sat on a mat", "one two three")


def test_agreement_drops_the_identity_layer_first(identity_engine, cache_dir):
    from d3.research.calibrate import CalibrationSet, calibrate

    cal_set = CalibrationSet("prompts:test", PROMPTS)
    result = calibrate(identity_engine, "agreement", cal_set, core=(1, 1), tokens=12)
    assert result.order[0] == 4
    assert sorted(result.order) == [1, 2, 3, 4, 5, 6]
    assert result.single[4] == 1.0 and result.single_kl[4] < 1e-6
    assert min(result.single[x] for x in (1, 2, 3, 5, 6)) < 1.0  # the other layers matter on this model
    assert result.full == 1.0 and len(result.curve) == 6 and result.curve[0] == 1.0
    assert result.curve[-1] <= result.curve[0]
    # cached: a later run reads the file instead of measuring
    path = next(cache_dir.rglob("*.json"))
    again = calibrate(identity_engine, "agreement", cal_set, core=(1, 1), tokens=12)
    assert again == result and path.is_file()


def test_parallel_pass_equals_teacher_forced_decoding(identity_engine):
    """The one-pass score of a fixed removal is what D3's own decode loop computes with that removal, teacher-forced."""
    import torch

    from d3.config import GenerationConfig
    from d3.research.calibrate import CalibrationSet, _own_answers

    tf = _own_answers(identity_engine, CalibrationSet("p", PROMPTS[:2]), 10)
    removed = (2, 5)
    ours = tf.logprobs(removed)  # [B, T, vocab]
    for b, (prompt, cont) in enumerate(zip(tf.prompts, tf.continuations)):
        steps = []
        run = identity_engine.run([prompt], StaticSkipConfig(skip=removed), GenerationConfig(max_new_tokens=len(cont) + 1),
                                  forced=[cont + [0]],
                                  observer=lambda step, out, state: steps.append(torch.log_softmax(out.logits[0], -1)))  # noqa: B023 (called within this iteration)
        for _ in run:
            pass
        # step 0 is the prompt's prefill; decode step k + 1 feeds continuation token k, scored at position k
        torch.testing.assert_close(torch.stack(steps[1:len(cont) + 1]), ours[b, :len(cont)], atol=2e-4, rtol=1e-4)


def test_resolve_a_name_and_generate_with_it(identity_engine, cache_dir):
    from d3.config import GenerationConfig
    from d3.research.calibrate import CalibrationSet, calibrate, resolve

    with pytest.raises(ValueError, match="python -m d3 calibrate"):
        resolve(D3Config(drop_order="calibrated", layer_order="agreement", core_head=1, core_tail=1), identity_engine)
    result = calibrate(identity_engine, "agreement", CalibrationSet("prompts:test", PROMPTS), core=(1, 1), tokens=8, steps=2)
    named = D3Config(alpha=0.8, drop_order="calibrated", layer_order="agreement", core_head=1, core_tail=1)
    assert resolve(named, identity_engine).layer_order == result.order
    trace = identity_engine.generate("hello", named, GenerationConfig(max_new_tokens=6))
    assert trace.strategy["layer_order"] == list(result.order) or trace.strategy["layer_order"] == result.order
    assert 4 not in trace.steps[2].layers_run  # the identity layer is the first dropped
    # another core is another calibration
    with pytest.raises(ValueError, match="core 2\\+1"):
        resolve(named.with_(core_head=2), identity_engine)


def test_perplexity_signal_reads_prose(identity_engine, cache_dir):
    from d3.research.calibrate import CalibrationSet, calibrate

    text = "the cat sat on the mat. " * 12
    result = calibrate(identity_engine, "perplexity", CalibrationSet("text:t", text=text), core=(1, 1), tokens=16, steps=1)
    assert abs(result.single[4] - result.full) < 1e-4 * result.full  # the identity layer changes nothing
    assert result.order[0] == min(result.single, key=result.single.get)  # lower perplexity is better
    assert result.curve[0] == result.single[result.order[0]] and result.curve[0] <= result.single[4]
    assert all(result.single[x] > 1 for x in result.order)


def test_cli_calibrate_prints_the_json(identity_engine, cache_dir, tmp_path, capsys):
    from d3.cli import main

    model_dir = tmp_path / "model"
    identity_engine.model.save_pretrained(model_dir)
    identity_engine.tokenizer.save_pretrained(model_dir)
    args = ["calibrate", "--model", str(model_dir), "--signal", "agreement", "--prompt", "hello there", "--steps", "2",
            "--tokens", "8", "--core-head", "1", "--core-tail", "1", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"model", "signal", "calibration_set", "order", "single", "curve", "seconds"} <= set(out)
    assert out["signal"] == "agreement" and out["calibration_set"].startswith("prompt:")
    assert sorted(out["order"]) == [1, 2, 3, 4, 5, 6] and len(out["curve"]) == 2 and len(out["single"]) == 6
    assert main(args) == 0  # cached: the same result again
    assert json.loads(capsys.readouterr().out) == out
    gen = ["generate", "--model", str(model_dir), "--prompt", "hi", "--max-new-tokens", "4", "--drop-order", "calibrated",
           "--layer-order", "agreement", "--core-head", "1", "--core-tail", "1", "--alpha", "0.8", "--json"]
    assert main(gen) == 0
    assert json.loads(capsys.readouterr().out)["strategy"]["layer_order"] == out["order"]


def test_cli_calibrate_refuses_a_mismatched_set_in_one_line(capsys):
    from d3.cli import main

    assert main(["calibrate", "--signal", "task", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "--task" in err and "\n" not in err
    assert main(["generate", "--prompt", "hi", "--drop-order", "bottom_up", "--layer-order", "3,4"]) == 2
    assert "only applies" in capsys.readouterr().err


def test_a_task_sets_questions_are_forced_one_batch_per_task_and_score_as_one(identity_engine):
    """Each task's questions form a batch of their own (its shots run once); the scores are those of one batch
    holding every question."""
    from d3.research.calibrate import CalibrationSet, _own_answers
    from d3.teacher_forced import Batches, TeacherForced

    tasks = ("gen_1_digit_addition", "gen_counting")
    tf = _own_answers(identity_engine, CalibrationSet("task:t", tasks=tasks, chat_template=False, val_limit=3), 12)
    assert isinstance(tf, Batches) and len(tf.parts) == 2 and all(len(p.prompts) == 3 for p in tf.parts)
    one = TeacherForced(identity_engine.adapter, *([row for p in tf.parts for row in getattr(p, name)]
                                                   for name in ("prompts", "continuations", "targets")))
    for removed in [(), (2,), (4, 6)]:
        for metric in ("agreement", "nll"):
            ours, theirs = tf.score(removed, metric), one.score(removed, metric)
            assert ours.value == pytest.approx(theirs.value, abs=1e-5) and ours.kl == pytest.approx(theirs.kl, abs=1e-5)
    assert tf.score((4,), "agreement").value == pytest.approx(1.0)  # the identity layer changes nothing


@pytest.mark.integration
def test_agreement_on_smollm2_one_prompt(smol_engine, cache_dir):
    from d3.research.calibrate import calibrate, prompt_set

    result = calibrate(smol_engine, "agreement", prompt_set("What is 3 plus 4?"), steps=2, tokens=12)
    assert sorted(result.order) == list(range(3, 27)) and len(result.single) == 24
    assert result.curve[0] == max(result.single.values())
    assert result.curve[1] <= result.curve[0] + 1e-9 or result.curve[1] <= 1.0


def test_prefilled_answers_equal_the_engines_own(identity_engine):
    """One shared prefill, copied per strategy, answers exactly as the engine's own loop (answer_batch) does."""
    from d3.research.answers import PrefilledQuestions
    from d3.research.sweep.generation import answer_batch

    class Echo:
        name, max_new_tokens = "echo", 12

        def prompt(self, ex):
            return ex

        def score(self, ex, text):
            return text.strip()[:1] == ex[-1]

    task, questions = Echo(), ["ab ab a", "hello hello h", "one two one", "xyz"]
    prefilled = PrefilledQuestions(identity_engine, task, questions, batch=3)
    for cfg in (D3Config(alpha=0.8, core_head=1, core_tail=1), StaticSkipConfig(skip=(2, 5)),
                D3Config(alpha=0.7, drop_order="strided", fill="none", core_head=1, core_tail=1)):
        ours = prefilled.answer(cfg)
        theirs = []
        for i in range(0, 4, 3):
            theirs += answer_batch(identity_engine, task, questions[i:i + 3], cfg)[0]
        assert list(ours.correct) == [a.correct for a in theirs]
        assert ours.mean_layers == pytest.approx(sum(a.layers for a in theirs) / sum(a.tokens for a in theirs))


def test_the_oracle_runs_under_a_calibrated_order(identity_engine):
    """Dropping the identity layer first never costs a token its top-1: every need fits in L - 1 layers."""
    from d3.research.oracle import measure

    first = D3Config(drop_order="calibrated", layer_order=(4, 1, 2, 3, 5, 6), core_head=1, core_tail=1)
    last = D3Config(drop_order="calibrated", layer_order=(1, 2, 3, 5, 6, 4), core_head=1, core_tail=1)
    need_first = measure(identity_engine, "hello there", first, 10).oracle_depth
    need_last = measure(identity_engine, "hello there", last, 10).oracle_depth
    assert max(need_first) <= 7
    assert sum(need_first) <= sum(need_last)


def test_calibration_announces_its_cost_before_the_first_removal(identity_engine, cache_dir):
    from d3.research.calibrate import CalibrationSet, calibrate, removals

    events = []
    calibrate(identity_engine, "agreement", CalibrationSet("prompts:cost", PROMPTS), core=(1, 1), tokens=6, steps=2,
              announce=lambda line: events.append(("announce", line)),
              progress=lambda done, total, what: events.append(("progress", total)))
    assert events[0][0] == "announce" and sum(kind == "announce" for kind, _ in events) == 1
    count = removals(6, 2)  # 6 flex layers, 2 greedy steps: 6 + 5 scored removals
    assert count == 11 and events[0][1].startswith(f"calibration: {count} scored removals x ")
    assert events[1] == ("progress", count)  # the count announced is the count run

def test_a_damaged_cached_calibration_is_measured_again_and_named(identity_engine, cache_dir, caplog):
    """A duplicated order in the cache file was printed with a "use it:" line; now it is named and measured again."""
    import logging

    from d3.research.calibrate import CalibrationSet, calibrate, calibration_path

    cal_set = CalibrationSet("prompts:test", PROMPTS[:1])
    result = calibrate(identity_engine, "agreement", cal_set, core=(1, 1), tokens=6, steps=1)
    path = calibration_path(identity_engine.name, "agreement", cal_set.name, (1, 1), 6, 1)
    path.write_text(json.dumps({**result.to_dict(), "order": [4, 4, 4]}))
    with caplog.at_level(logging.WARNING):
        again = calibrate(identity_engine, "agreement", cal_set, core=(1, 1), tokens=6, steps=1)
    assert again.order == result.order and path.name in caplog.text and "measuring again" in caplog.text
    assert json.loads(path.read_text())["order"] == list(result.order)  # the bad file was replaced


@pytest.mark.parametrize("allowed", [0, 1, 5])
def test_a_measurement_stops_within_one_pass_of_should_stop(identity_engine, allowed):
    """should_stop() is asked before each decoding step of the answers and before each scored removal."""
    from d3.research import Stopped
    from d3.research.calibrate import CalibrationSet, calibrate_and_compare

    asked, passes = [], []

    def should_stop() -> bool:
        asked.append(1)
        return len(asked) > allowed

    with pytest.raises(Stopped):
        calibrate_and_compare(identity_engine, "agreement", CalibrationSet("p", PROMPTS[:1]), {"x": (1, 2, 3)},
                              core=(1, 1), steps=2, tokens=4, should_stop=should_stop,
                              progress=lambda done, total, what: passes.append(done))
    assert allowed + 1 <= len(asked) <= allowed + 2  # asked once more after the loop it ended; nothing ran between
    assert len(passes) <= max(0, allowed - 4)  # 4 decode steps and the full-depth score come first


def test_greedy_order_ends_its_greedy_part_where_another_step_says_so():
    from d3.research.calibrate import Score, greedy_order

    harm = {1: 0.5, 2: 0.1, 3: 0.9, 4: 0.3}  # what each layer costs the signal, removals adding up
    asked: list[tuple[int, int]] = []

    def another_step(k: int, done: int) -> bool:
        asked.append((k, done))
        return k < 2

    order, single, curve = greedy_order(list(harm), lambda removed: Score(1 - sum(harm[x] for x in removed), 0.0),
                                        higher=True, steps=4, another_step=another_step)
    assert asked == [(1, 4), (2, 7)]  # before steps 2 and 3, after 4 and then 4 + 3 scored removals
    assert len(curve) == 2 and order == (2, 4, 1, 3)  # 2 greedy steps, the rest by single drop
    assert set(single) == set(harm)


@pytest.mark.parametrize("budget, steps", [(None, 4), (0.0, 1)])
def test_a_budget_fits_the_greedy_steps(identity_engine, budget, steps):
    from d3.research.calibrate import CalibrationSet, calibrate_and_compare

    cal, curves = calibrate_and_compare(identity_engine, "agreement", CalibrationSet("p", PROMPTS[:1]), {"x": (1, 2, 3)},
                                        core=(1, 1), steps=4, tokens=4, budget_s=budget)
    assert cal.steps == steps and len(cal.curve) == steps and len(curves["x"]) == min(steps, 3)
    assert sorted(cal.order) == [1, 2, 3, 4, 5, 6] and cal.order[0] == 4  # the identity layer first either way


def test_the_teacher_forced_prompt_pass_holds_the_engine_lock(tiny_engine, monkeypatch) -> None:
    """A measurement's teacher-forced prompt pass ran without the engine's lock: on a server, beside another
    session's traced step (its recording hooks on the same layers), that step failed (class load test)."""
    from d3.research import calibrate as calibrate_module
    from d3.research.calibrate import prompt_set

    held, real = [], calibrate_module.TeacherForced

    def spy(*args, **kwargs):
        held.append(tiny_engine.lock.locked())
        return real(*args, **kwargs)

    monkeypatch.setattr(calibrate_module, "TeacherForced", spy)
    calibrate_module.scorer(tiny_engine, "agreement", prompt_set("hello there", True), tokens=4)
    assert held == [True]
