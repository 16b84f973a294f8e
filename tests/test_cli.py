"""`python -m d3`: bad arguments exit 2 with one line, generate prints text and a per-token summary."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from d3 import cli


@pytest.fixture
def tiny_cli(monkeypatch, tiny_engine):
    monkeypatch.setattr(cli, "load_engine", lambda args: tiny_engine)


@pytest.mark.parametrize("argv,message", [
    (["generate", "--prompt", ""], "prompt is empty"),
    (["generate", "--prompt", "hi", "--alpha", "1.5"], "alpha=1.5 is not allowed"),
    (["generate", "--prompt", "hi", "--strategy", "full", "--alpha", "0.9"], "--alpha does not apply"),
    (["generate", "--prompt", "hi", "--fill", "zeros"], "invalid choice"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "-4"], "--max-new-tokens must be an integer in [1, 1024]"),
    (["generate", "--prompt", "hi", "--alpha", "abc"], "argument --alpha: 'abc' is not allowed"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_arguments_exit_2_with_one_line(tiny_cli, capsys, argv, message):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_core_larger_than_model(tiny_cli, capsys):
    assert cli.main(["generate", "--prompt", "hi", "--core-head", "5", "--core-tail", "5"]) == 2
    assert "at most 5: the model's 6 layers less one flex layer" in capsys.readouterr().err


def test_generate_prints_text_and_per_token_summary(tiny_cli, capsys):
    assert cli.main(["generate", "--prompt", "hello", "--alpha", "0.8", "--core-head", "1", "--core-tail", "1",
                     "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert "step  layers" in out and "theoretical speedup" in out
    assert " 6/6 " in out and " 2/6 " in out  # full depth at the first token, the core floor later


def test_generate_json_is_the_whole_trace(tiny_cli, capsys):
    assert cli.main(["generate", "--prompt", "hello", "--strategy", "skipdecode", "--max-layers", "5",
                     "--min-layers", "2", "--max-new-tokens", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["strategy"]["strategy"] == "skipdecode" and len(data["steps"]) == 8
    assert data["steps"][1]["layers_run"][0] == 0  # the warm-up layer


def _must_not_run(*args, **kwargs):
    raise AssertionError("the command started its work despite a bad path")


@pytest.mark.parametrize("command", ["sweep", "report", "bench"])
def test_an_output_path_that_is_a_directory_fails_before_any_work(command, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("d3.research.sweep.run.run_sweep", _must_not_run)
    monkeypatch.setattr("d3.models.get_model", _must_not_run)
    monkeypatch.setattr("viz.report.write_html", _must_not_run)
    results = tmp_path / "x.csv"
    results.write_text("key\n")
    flag = "--json" if command == "bench" else "--out"
    argv = [command, flag, str(tmp_path)] + (["--results", str(results)] if command == "report" else [])
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert f"{flag} {tmp_path} is a directory" in err and "\n" not in err and "Traceback" not in err


def test_an_output_under_a_file_fails_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("d3.research.sweep.run.run_sweep", _must_not_run)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli.main(["sweep", "--out", str(blocker / "sweep.csv")]) == 2
    assert f"{blocker} is a file" in capsys.readouterr().err


@pytest.mark.parametrize("missing", ["missing.csv", "."])
def test_report_on_missing_results_exits_2_with_one_line(missing, tmp_path, capsys):
    path = tmp_path / missing
    assert cli.main(["report", "--results", str(path), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--results {path}" in err and "\n" not in err and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("spacing,layers", [("integer", [0, 2, 4, 5]), ("even", [0, 2, 3, 5])])
def test_unified_spacing_flag(tiny_cli, capsys, spacing, layers):
    assert cli.main(["generate", "--prompt", "hello", "--strategy", "unified", "--ratio", "1.5", "--spacing", spacing,
                     "--max-new-tokens", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["strategy"]["spacing"] == spacing and data["steps"][1]["layers_run"] == layers  # 4 of 6 layers
    assert cli.main(["generate", "--prompt", "hi", "--spacing", spacing]) == 2
    assert "--spacing does not apply to --strategy d3" in capsys.readouterr().err


def test_info_on_a_directory_without_weights_exits_2_with_one_line(tmp_path, capsys):
    from tests.tiny import tiny_llama

    tiny_llama().config.save_pretrained(str(tmp_path))  # config.json, no weights
    assert cli.main(["info", "--model", str(tmp_path), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: could not read the weights of") and "model.safetensors" in err
    assert "\n" not in err and "Traceback" not in err


@pytest.mark.integration
def test_cli_on_the_embedded_model():
    run = lambda *a: subprocess.run([sys.executable, "-m", "d3", *a], capture_output=True, text=True, timeout=300)
    info = run("info", "--json")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["num_layers"] == 30
    out = run("generate", "--prompt", "Name a colour.", "--max-new-tokens", "8", "--json")
    assert out.returncode == 0, out.stderr
    trace = json.loads(out.stdout)
    assert trace["num_layers"] == 30 and 1 <= len(trace["steps"]) <= 8
    bad = run("generate", "--prompt", "hi", "--model", "no-such-model")
    assert bad.returncode == 2 and "unknown model" in bad.stderr and "Traceback" not in bad.stderr


def test_info_names_the_family_how_exact_each_fill_is_and_the_dtype_gap(tmp_path, capsys):
    from d3.testing import clear_model_cache, tiny_family_model, tiny_tokenizer

    tiny_family_model("qwen3").save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    try:
        assert cli.main(["info", "--model", str(tmp_path), "--device", "cpu"]) == 0
        out = capsys.readouterr().out
        assert "family: Qwen 3" in out and "propagate: exact" in out and "copy: approximate" in out
        assert "dtype_gap" not in out
        assert cli.main(["info", "--model", str(tmp_path), "--device", "cpu", "--dtype", "bfloat16", "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["dtype"] == "bfloat16" and info["dtype_gap"].startswith("bfloat16 against float32 over 16 greedy")
        assert set(info["fills"]) == {"full depth", "propagate", "copy", "copy_any_type", "none"}
    finally:
        clear_model_cache()

def _no_model(*args, **kwargs):
    raise AssertionError("the model was loaded for a flag that could be refused before")


@pytest.mark.parametrize("argv,flag", [
    (["bench", "--prompts", "0"], "--prompts"),
    (["bench", "--new-tokens", "0"], "--new-tokens"),
    (["bench", "--repeats", "0"], "--repeats"),
    (["sweep", "--tasks", "nope"], "--tasks"),
    (["sweep", "--cores", "20+20"], "--cores 20+20"),
    (["sweep", "--cores", "3"], "--cores '3'"),
    (["sweep", "--depths", "x,1/0"], "--depths"),
    (["sweep", "--starts", "a"], "--starts"),
    (["sweep", "--repeats", "0"], "--repeats"),
])
def test_a_bad_measuring_flag_is_refused_before_the_model_loads(argv, flag, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("d3.models.get_model", _no_model)
    monkeypatch.setattr("d3.research.sweep.run.load_engine", _no_model)
    monkeypatch.setattr("d3.research.sweep.run.run_sweep", _no_model)
    extra = ["--out", str(tmp_path / "s.csv")] if argv[0] == "sweep" else []
    assert cli.main([*argv, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert flag in err and "\n" not in err and "Traceback" not in err


def test_a_core_too_large_for_a_local_model_is_refused_right_after_it_loads(tiny_engine, tmp_path, monkeypatch,
                                                                           capsys):
    monkeypatch.setattr("d3.research.sweep.run.load_engine", lambda name: tiny_engine)
    monkeypatch.setattr("d3.research.sweep.run.run_sweep", _no_model)
    argv = ["sweep", "--model", str(tmp_path), "--cores", "4+4", "--out", str(tmp_path / "s.csv")]
    assert cli.main(argv) == 2
    assert f"--cores 4+4: head + tail must be at most 5, leaving one of {tmp_path}'s 6 layers" in capsys.readouterr().err


def test_an_unknown_layer_order_name_suggests_real_signals(tiny_cli, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("D3_CALIBRATION_DIR", str(tmp_path))
    argv = ["generate", "--prompt", "hi", "--drop-order", "calibrated", "--layer-order", "nonexistent",
            "--core-head", "1", "--core-tail", "1"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "--layer-order 'nonexistent'" in err and "agreement, perplexity, task" in err
    assert "--signal nonexistent" not in err


def test_sweep_prints_every_difference_with_its_paired_interval() -> None:
    import pandas as pd

    from d3.cli.sweep import paired_lines

    df = pd.DataFrame([
        {"label": "full depth", "mean_layers": 30.0, "measured_speedup": 1.0, "agreement": 1.0, "agreement_low": 1.0,
         "agreement_high": 1.0, "diff": 0.0, "diff_low": 0.0, "diff_high": 0.0},
        {"label": "d3 a=0.99", "mean_layers": 27.5, "measured_speedup": 1.08, "agreement": 0.75, "agreement_low": 0.5,
         "agreement_high": 1.0, "diff": -0.02, "diff_low": -0.05, "diff_high": 0.01},
        {"label": "one prompt", "mean_layers": 27.5, "measured_speedup": 1.08, "agreement": 0.75,
         "agreement_low": float("nan"), "agreement_high": float("nan"), "diff": float("nan"), "diff_low": float("nan"),
         "diff_high": float("nan")}])
    lines = paired_lines(df)
    assert lines[0] == ("full depth: 30.00 layers, 1.00x measured; accuracy +0.0 [+0.0, +0.0] pts; "
                        "agreement +0.0 [+0.0, +0.0] pts")
    assert lines[1] == ("d3 a=0.99: 27.50 layers, 1.08x measured; accuracy -2.0 [-5.0, +1.0] pts; "
                        "agreement -25.0 [-50.0, +0.0] pts")
    assert lines[2] == "one prompt: 27.50 layers, 1.08x measured; agreement -25.0 pts (one prompt: no interval)"


def test_sweep_on_a_tiny_model_prints_each_rows_paired_interval(tiny_engine, tmp_path, capsys) -> None:
    """`d3 sweep` with two of the shipped prompts: every row's line carries agreement's 95% interval over the prompts."""
    from d3.cli import build_parser
    from d3.cli.sweep import main as sweep_main

    args = build_parser().parse_args(["sweep", "--prompts", "2", "--new-tokens", "3", "--repeats", "1",
                                      "--depths", "0.5", "--baselines", "", "--ppl-chunks", "0",
                                      "--out", str(tmp_path / "s.csv")])
    assert sweep_main(args, engine=tiny_engine) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if "layers," in x]
    assert len(lines) == 2 and all("agreement" in x and "[" in x and "pts" in x for x in lines)


@pytest.mark.parametrize("argv, message", [
    (["calibrate", "--threads", "-1"], "argument --threads: '-1' is not allowed: an integer in [0, 1024]"),
    (["oracle", "--prompt", "hi", "--threads", "-1"], "argument --threads: '-1' is not allowed"),
    (["paper", "--threads", "-1"], "argument --threads: '-1' is not allowed"),
    (["bench", "--prompts", "1000"], "argument --prompts: '1000' is not allowed: an integer in [1, "),
    (["calibrate", "--steps", "1000"], "--steps must be an integer in [1, 24]"),
    (["calibrate", "--core-head", "20", "--core-tail", "10"], "--core-head + --core-tail=30 is not allowed"),
    (["generate", "--prompt", "hi", "--strategy", "early_exit", "--min-layers", "40"],
     "min_layers must be at most the model's 6 layers"),
    (["generate", "--prompt", "hi", "--strategy", "skipdecode", "--min-layers", "40"],
     "min_layers must be at most max_layers (4 on this model's 6 layers)"),
    (["oracle", "--prompt", "hi", "--alpha", "1.5"], "--alpha must be a number in (0, 1]"),
    (["oracle", "--prompt", "hi", "--drop-order", "sideways"], "invalid choice"),
    (["sweep", "--new-tokens", "1"], "--new-tokens must be an integer in [2, 1024]"),
])
def test_the_cli_refuses_what_it_cannot_do_in_one_line(tiny_cli, monkeypatch, capsys, argv, message):
    """Issue 36, item 7: exit 2, one line naming the flag and the allowed range, no traceback, before any model
    loads (calibrate's steps: SmolLM2's 30 layers are known without loading it)."""
    monkeypatch.setattr("d3.models.get_model", _must_not_run)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


@pytest.mark.parametrize("text", ["name,score\nalpha,1\n", '{"broken": ', "strategy,key,label,params,mean_layers,"
                                  "measured_speedup\nd3,k,x,{},20,1.2\n"])
def test_report_refuses_results_that_are_not_a_sweeps(tmp_path, monkeypatch, capsys, text):
    """Another CSV, broken JSON, or a sweep's table without its full-depth reference: exit 2 in one line, and no
    report.html claiming that no baseline beats D3 (issue 36, item 7)."""
    results = tmp_path / "results.csv"
    results.write_text(text)
    out = tmp_path / "report.html"
    assert cli.main(["report", "--results", str(results), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--results {results}" in err and "\n" not in err and "Traceback" not in err
    assert not out.exists()


def test_every_command_defaults_to_the_one_default_model():
    from d3.config import DEFAULT_MODEL

    parser = cli.build_parser()
    choices = parser._subparsers._group_actions[0].choices  # the subcommands
    models = {name: sub.get_default("model") for name, sub in choices.items()
              if any(action.dest == "model" for action in sub._actions)}
    assert models and set(models.values()) == {DEFAULT_MODEL}, models


# -- issue 41 item 8: what a hostile caller tried, each refused in one line before any work -----------------------


def _refused(argv, monkeypatch, capsys) -> str:
    """Run the CLI with every way of loading a model or starting a sweep replaced by a failure: exit 2, one line."""
    for target in ("d3.models.get_model", "d3.models.load_model", "d3.research.sweep.run.load_engine",
                   "d3.research.sweep.run.run_sweep"):
        monkeypatch.setattr(target, _must_not_run)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_a_device_this_machine_lacks_is_refused_in_one_line(monkeypatch, capsys):
    import torch

    if torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    err = _refused(["generate", "--prompt", "hi", "--device", "mps"], monkeypatch, capsys)
    assert "--device mps" in err and "MPS" in err and "not available" in err
    err = _refused(["info", "--device", f"cuda:{torch.cuda.device_count() + 3}"], monkeypatch, capsys)
    assert "--device cuda:" in err


def test_paper_calibrate_steps_are_capped_like_calibrates(monkeypatch, capsys):
    """SmolLM2's 30 layers with the default core 3+3 leave 24 flex layers: calibrate --steps and paper
    --calibrate-steps both stop there, before the model loads."""
    err = _refused(["paper", "--calibrate-steps", "1000"], monkeypatch, capsys)
    assert "--calibrate-steps must be an integer in [1, 24]" in err
    assert "--steps must be an integer in [1, 24]" in _refused(["calibrate", "--steps", "1000"], monkeypatch, capsys)
    assert "argument --calibrate-steps: '0' is not allowed" in _refused(["paper", "--calibrate-steps", "0"],
                                                                        monkeypatch, capsys)


def _unwritable_paths(tmp_path):
    # A name longer than any file system allows (fails for root too), and a folder that cannot be made.
    return [tmp_path / ("x" * 300 + ".csv"), "/proc/d3-no-such-folder/out.csv"]


@pytest.mark.parametrize("argv", [["sweep"], ["paper"], ["oracle", "--prompt", "hi"]])
def test_an_unwritable_out_is_found_before_the_work(argv, tmp_path, monkeypatch, capsys):
    for path in _unwritable_paths(tmp_path):
        err = _refused([*argv, "--out", str(path)], monkeypatch, capsys)
        assert f"--out {path} cannot be written" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # the probe left nothing behind


def test_a_writable_out_is_left_as_it_was(tmp_path):
    from d3.cli.common import check_output_file

    existing = tmp_path / "old.csv"
    existing.write_text("kept\n")
    check_output_file(existing, "--out")
    check_output_file(tmp_path / "new" / "deeper" / "out.csv", "--out")
    check_output_file(tmp_path / "new.csv", "--out")
    assert existing.read_text() == "kept\n" and sorted(p.name for p in tmp_path.iterdir()) == ["old.csv"]


@pytest.mark.parametrize("text", ["name,score\nalpha,1\n", "key,label,not_a_sweep_column\nk,x,1\n", "\x00\xff\xfe\n"])
def test_sweep_refuses_to_append_to_a_csv_that_is_not_a_sweeps(text, tmp_path, monkeypatch, capsys):
    out = tmp_path / "other.csv"
    out.write_bytes(text.encode("latin-1"))
    err = _refused(["sweep", "--out", str(out)], monkeypatch, capsys)
    assert f"--out {out} is not a sweep's table" in err
    assert out.read_bytes() == text.encode("latin-1")
    err = _refused(["sweep", "--out", str(out), "--task-mode", "generate", "--tasks", "default"], monkeypatch, capsys)
    assert "is not a generation sweep's table" in err


def test_sweep_accepts_its_own_table_to_resume(tmp_path):
    from d3.cli.sweep import check_results_file
    from d3.research.sweep.table import COLUMNS

    out = tmp_path / "sweep.csv"
    out.write_text(",".join(COLUMNS[:12]) + "\n")  # a table from before the later columns were added
    check_results_file(out, "score")
    (tmp_path / "empty.csv").write_text("")
    check_results_file(tmp_path / "empty.csv", "score")


@pytest.mark.parametrize("argv,flag", [
    (["generate", "--prompt", "hi", "--alpha", "٠.٩"], "--alpha"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "١٢"], "--max-new-tokens"),
    (["oracle", "--prompt", "hi", "--alpha", "٠.٩"], "--alpha"),
    (["oracle", "--prompt", "hi", "--underserved-at", "٠.٩"], "--underserved-at"),
    (["sweep", "--alphas", "٠.٩"], "--alphas"),
    (["sweep", "--starts", "٣"], "--starts"),
    (["sweep", "--cores", "٣+٣"], "--cores"),
    (["paper", "--alphas", "٠.٩"], "--alphas"),
    (["generate", "--prompt", "hi", "--start", "1e21"], "--start"),
    (["generate", "--prompt", "hi", "--start", str(10**21)], "--start must be an integer <= 1024"),
    (["oracle", "--prompt", "hi", "--start", str(10**21)], "--start must be an integer in [0, 1024]"),
    (["oracle", "--prompt", "hi", "--count", "-1"], "argument --count: '-1' is not allowed"),
    (["oracle", "--prompts-file", "assets/prompts.json", "--count", "0"], "argument --count: '0' is not allowed"),
    (["oracle", "--prompt", "hi", "--k", "200"], "--k must be a percentage in [0, 100]"),
])
def test_numbers_a_person_did_not_mean_are_refused(argv, flag, tmp_path, monkeypatch, capsys):
    extra = ["--out", str(tmp_path / "s.csv")] if argv[0] in ("sweep", "paper") else []
    assert flag in _refused([*argv, *extra], monkeypatch, capsys)


# -- issue 43 item 3: every subcommand's flags from the registry -------------------------------------------------


def test_building_the_parser_does_not_import_torch():
    probe = ("import sys\nfrom d3.cli import build_parser\nbuild_parser()\n"
             "print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr


def test_sweeps_defaults_are_the_specs_own():
    """No flag restates a SweepSpec default: the flags left out give the spec's own defaults."""
    from dataclasses import fields

    from d3.cli.sweep import spec_from_args
    from d3.research.sweep.spec import SweepSpec

    spec = spec_from_args(cli.build_parser().parse_args(["sweep"]))
    own = SweepSpec()
    differ = [f.name for f in fields(SweepSpec) if getattr(spec, f.name) != getattr(own, f.name)]
    assert differ == ["prompts"]  # the CLI reads them from assets/prompts.json
    assert len(spec.prompts) == len(own.prompts)


def test_bench_and_paper_ranges_are_the_registrys(monkeypatch, capsys):
    from d3.config import MAX_NEW_TOKENS_CAP, D3Config, params

    err = _refused(["bench", "--new-tokens", str(MAX_NEW_TOKENS_CAP + 1)], monkeypatch, capsys)
    assert f"--new-tokens must be an integer in [2, {MAX_NEW_TOKENS_CAP}]" in err
    err = _refused(["paper", "--alphas", "0.9,1.5"], monkeypatch, capsys)
    assert f"each alpha must be {params(D3Config)['alpha'].allowed()}" in err
    err = _refused(["paper", "--drop-orders", "sideways"], monkeypatch, capsys)
    assert "middle_out, top_down, bottom_up, strided, task" in err  # d3.config.DROP_ORDERS' named orders, and task
    args = cli.build_parser().parse_args(["bench"])
    assert (args.max_new_tokens, args.repeats) == (128, params(__import__("d3.research.sweep.spec", fromlist=["x"])
                                                              .SweepSpec)["repeats"].default)


def test_every_registered_sweep_field_is_a_sweep_flag():
    """A field of SweepSpec given a Param is a flag of `sweep`, with the Param's default (nothing restated)."""
    from d3.config import params
    from d3.research.sweep.spec import SweepSpec

    parser = cli.build_parser()
    sweep = parser._subparsers._group_actions[0].choices["sweep"]
    dests = {action.dest: action for action in sweep._actions}
    for name, prm in params(SweepSpec).items():
        assert name in dests, name
        if name != "variants_at":  # given as a fraction ("2/3"); its default is the spec's (test above)
            assert dests[name].default == prm.default, name
