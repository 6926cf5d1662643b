"""Study 02's building blocks: configuration errors, mask schedules, the Keras trainable traps."""

import numpy as np
import pytest
import tensorflow as tf

from study import cnn, intervals
from study.models import deep_mnist_cnn
from study.report import prose, reporting


@pytest.mark.parametrize("bad, match", [
    ({"p_values": [0.5, 1.5]}, r"p_values: expected a number in \[0.0, 1.0\]; got 1.5"),
    ({"p_values": []}, "p_values: expected a non-empty list"),
    ({"mask_optimizers": ["adam", "sgdd"]}, "mask_optimizers: got 'sgdd'; allowed: 'sgd'"),
    ({"finetune_methods": ["freeze_all"]}, "finetune_methods: got 'freeze_all'; allowed: 'var_list'"),
    ({"mask_methods": ["hold", "drop"]}, "mask_methods: got 'drop'"),
    ({"data_path": "/nowhere/mnist.npz"}, "data_path: '/nowhere/mnist.npz' does not exist; expected None"),
    ({"seeds": [0, 1.5]}, "seeds: expected a non-empty list of integers"),
    ({"seeds": "0,1"}, "seeds: expected a non-empty list of integers"),
    ({"mask_steps": 0}, "mask_steps: expected an integer >= 1"),
    ({"learning_rates": {"sgd": 0.1}}, r"learning_rates: no rate for \['adam'\]"),
    ({"allow_download": "yes"}, "allow_download: expected true or false"),
    ({"data_seed": -1}, "data_seed: expected an integer >= 0; got -1"),
])
def test_bad_parameters_fail_before_training(bad, match):
    with pytest.raises(ValueError, match=match):
        cnn.CnnStudyConfig(**bad)


def test_random_masks_are_reproducible_fresh_each_step_and_about_p():
    variables = deep_mnist_cnn().trainable_variables
    a = cnn.random_masks(variables, tf.constant(3, tf.int64), 0.25, tf.constant(7, tf.int64))
    b = cnn.random_masks(variables, tf.constant(3, tf.int64), 0.25, tf.constant(7, tf.int64))
    c = cnn.random_masks(variables, tf.constant(4, tf.int64), 0.25, tf.constant(7, tf.int64))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[4], c[4])
    fc1 = a[4].numpy()
    assert fc1.shape == (3136, 1024) and abs(fc1.mean() - 0.25) < 0.01


def test_block_masks_train_one_layer_at_a_time():
    variables = deep_mnist_cnn().trainable_variables
    schedule = cnn.block_masks(every=2)
    active = [[bool(m) for m in schedule(variables, tf.constant(s, tf.int64), 0.0, 0)] for s in range(10)]
    assert active[0] == [True, True, False, False, False, False, False, False]  # conv1 kernel and bias
    assert active[2] == [False, False, True, True, False, False, False, False]  # conv2
    assert active[6] == [False] * 6 + [True, True]  # fc2
    assert active[8] == active[0]  # and round again


def test_keras_trainable_traps_are_as_the_guide_reports():
    traps = cnn.keras_trainable_traps().set_index("scenario")
    assert traps.iloc[0]["trained"] is True  # frozen without recompiling: still trains
    assert traps.iloc[1]["trained"] is False  # recompiled: frozen
    assert traps.iloc[2]["trained"] is False  # unfrozen without recompiling: silently does not train
    assert traps.iloc[3]["error"].startswith("Unknown variable")


def test_config_defaults_live_in_the_dataclass_and_the_notebook_declares_every_one_as_none():
    import ast
    from pathlib import Path

    import nbformat

    nb = nbformat.read(Path(__file__).resolve().parents[1] / "notebooks" / "02_mnist_cnn_freezing.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    declared = {t.id: ast.literal_eval(node.value) for node in ast.parse(cell.source).body
                for t in node.targets}
    assert declared.pop("out_dir") == "../build/interactive/02_mnist_cnn_freezing"
    assert list(declared) == cnn.CnnStudyConfig.parameter_names()
    assert set(declared.values()) == {None}  # no default repeated in the notebook
    config = cnn.CnnStudyConfig.from_parameters({**declared, "seeds": [4], "out_dir": "x", "other": 1})
    assert config.seeds == [4] and config.batch == cnn.CnnStudyConfig().batch
    with pytest.raises(ValueError, match="batch: expected an integer >= 1"):
        cnn.CnnStudyConfig.from_parameters({"batch": 0})


def test_full_yaml_repeats_no_default():
    from pathlib import Path

    import yaml

    params = Path(__file__).resolve().parents[1] / "notebooks" / "params"
    defaults = cnn.CnnStudyConfig().plain()
    for profile in ("full", "smoke"):
        given = yaml.safe_load((params / f"02_mnist_cnn_freezing.{profile}.yaml").read_text()) or {}
        repeated = {k: v for k, v in given.items() if defaults.get(k) == v}
        assert repeated == {}, f"{profile}: {repeated} repeat the defaults of CnnStudyConfig"


def _steps_table(with_p: bool) -> "pd.DataFrame":
    import pandas as pd

    rows = []
    for method, changed in (("naive", 5), ("hold", 0)):
        for seed in (0, 1):
            for step in (1, 2, 3):
                row = {"experiment": "x", "optimizer": "adam", "method": method, "seed": seed, "step": step,
                       "loss": 1.0, "frozen_entries": 10, "frozen_changed": changed * (step > 1),
                       "frozen_max_abs_delta": 0.1 * changed * (step > 1), "step_time_ms": 10.0 + step,
                       "accuracy": 0.5 + 0.1 * seed if step == 3 else np.nan}
                if with_p:
                    row["p"] = 0.5
                rows.append(row)
    return pd.DataFrame(rows)


@pytest.mark.parametrize("with_p", [True, False], ids=["masks", "blocks"])
def test_summaries_keep_every_run_with_or_without_p(with_p):
    # The block study has no p. It once carried p = NaN, and pandas' groupby dropped every row of it.
    summary = cnn.masked_summary(_steps_table(with_p))
    assert ("p" in summary.columns) == with_p
    assert not summary.isna().any().any()
    s = summary.set_index("method")
    assert s.loc["naive", "frozen_changed_total_mean"] == 10 and s.loc["hold", "frozen_changed_total_mean"] == 0
    assert s.loc["naive", "frozen_entries_total_mean"] == 30 and s.loc["naive", "seeds"] == 2
    assert s.loc["naive", "accuracy_mean"] == pytest.approx(0.55)
    assert s.loc["naive", "step_time_ms_mean"] == 12.5  # median of steps 2 and 3: the traced first step left out


@pytest.mark.slow  # over 4 s: make test-slow (CI)
def test_block_study_records_drift_of_resting_blocks_and_reruns_bit_identically():
    import pandas as pd

    from study.data import load_mnist

    config = cnn.CnnStudyConfig(seeds=[0], batch=8, block_optimizers=["adam"], block_every=1, block_steps=3,
                                      mask_methods=["naive", "hold"], eval_every=3, eval_samples=20)
    data = load_mnist(seed=0, train_limit=200)
    first = cnn.block_study(config, data, progress=False)
    second = cnn.block_study(config, data, progress=False)
    assert "p" not in first.columns
    summary = cnn.masked_summary(first).set_index("method")
    assert len(summary) == 2 and summary.filter(like="_mean").notna().all().all()
    assert summary.loc["naive", "frozen_changed_total_mean"] > 0  # conv1 rests in step 2 and moves on Adam's moments
    assert summary.loc["hold", "frozen_changed_total_mean"] == 0
    stable = first.columns.drop("step_time_ms")
    pd.testing.assert_frame_equal(first[stable], second[stable], check_exact=True)


def test_naive_vs_exact_and_headline_cover_every_row():
    import pandas as pd

    masks = cnn.masked_summary(_steps_table(True))
    blocks = cnn.masked_summary(_steps_table(False))
    trade = cnn.naive_vs_exact(_steps_table(True))
    assert list(trade.columns) == list(cnn.NAIVE_VS_EXACT_COLUMNS)
    assert trade.loc[0, "share of frozen entry-steps the naive mask moved"] == pytest.approx(10 / 30)
    assert trade.loc[0, "naive accuracy mean"] == pytest.approx(0.55)  # numbers in the CSV, text only for display
    shown = cnn.naive_vs_exact_display(trade)
    assert shown.iloc[0]["naive accuracy (mean ± std)"] == "0.550 ± 0.071"  # the mean to the std's decimal place
    assert shown.iloc[0]["seeds naive higher"] == "0 of 2" and trade.loc[0, "naive minus hold"] == 0
    assert shown.iloc[0]["share of frozen entry-steps the naive mask moved"] == "33%"
    finetune = pd.DataFrame([{"optimizer": o, "method": m, "seed": s, "acc_new": 0.9, "acc_old": 0.0,
                              "conv_max_abs_delta": 0.0, "conv_changed_entries": 0, "step_time_ms": 1.0}
                             for o in ("sgd", "adam") for m in ("var_list", "gate") for s in (0, 1)])
    traps = pd.DataFrame(columns=list(cnn.TRAP_COLUMNS))
    config = cnn.CnnStudyConfig(seeds=[0, 1])
    head = cnn.headline(config, cnn.finetune_summary(finetune), traps, masks, blocks, "synthetic")
    keys = " | ".join(head)
    for o in ("sgd", "adam"):
        for m in ("var_list", "gate"):
            assert f"fine-tune {o}/{m}:" in keys
    for m in ("naive", "hold"):
        assert f"masks p=0.5 adam/{m}:" in keys and f"blocks adam/{m}:" in keys
    assert ("fine-tune adam: median step time of a run (ms, mean ± std over seeds)" in keys
            and "masks adam: step time (ms;" in keys)
    assert all("±" in v for k, v in head.items() if ("fine-tune" in k or "masks" in k or "blocks" in k)
               and "over the p's" not in k)  # one p here: no spread over p's to show


# -- the data dictionary: reporting.save_table(columns=...) and site.write_columns -----------------------
def test_save_table_records_every_column_and_the_pipeline_writes_columns_md(tmp_path):
    import json

    import pandas as pd

    from study.report import reporting, site

    study = tmp_path / "02_x"
    table = pd.DataFrame({"a": [1], "b|c": [2.0], "d": ["x"]})
    reporting.save_table(table, study, "t1", columns={"a": "apples (count)", "b|c": "ratio (fraction)", "z": "unused"})
    reporting.save_table(table[["a"]], study, "t2")  # no descriptions: listed as (not described)
    (study / "legacy.csv").write_text("q,r\n1,2\n")  # not written by save_table: listed from its header
    assert reporting.table_columns(study) == {"t1.csv": {"a": "apples (count)", "b|c": "ratio (fraction)", "d": None},
                                              "t2.csv": {"a": None}}
    reporting.save_table(table[["d", "b|c"]], study, "t1", columns={"d": "a letter", "b|c": "ratio (fraction)"})
    assert list(reporting.table_columns(study)) == ["t1.csv", "t2.csv"]  # saved again: replaced, order kept
    assert reporting.table_columns(study)["t1.csv"] == {"d": "a letter", "b|c": "ratio (fraction)"}
    with pytest.raises(ValueError, match="columns must map column names to descriptions"):
        reporting.save_table(table, study, "t3", columns={"a": 1})
    (tmp_path / "manifest.json").write_text(json.dumps({"02_x": {"title": "02 · X"}, "03_missing": {}}))
    text = site.write_columns(tmp_path).read_text()
    assert '<a id="02_x"></a>' in text and "## 02_x: 02 · X" in text
    assert "### [t1.csv](02_x/t1.csv)" in text and "| `d` | a letter |" in text
    assert "| `a` | (not described) |" in text  # t2
    assert "| `b\\|c` | ratio (fraction) |" in text  # a pipe in a name does not split the Markdown table
    assert "### [legacy.csv](02_x/legacy.csv)" in text and "| `q` | (not described) |" in text
    assert "## 03_missing" in text and "No tables." in text


def test_report_tables_show_no_raw_none_false_or_scientific_counts():
    import pandas as pd

    config = cnn.CnnStudyConfig(seeds=[0, 1])
    values = cnn.config_table(config)["value"]
    assert values["data_path"] == "—" and values["train_limit"] == "—" and values["allow_download"] == "no"
    work = cnn.workload(cnn.CnnStudyConfig())
    assert work.loc["total", "steps per run"] == "—" and "," in work.loc["total", "steps"]
    summary = pd.DataFrame({"method": ["naive"], "changed_mean": [7326424.5], "changed_std": [79581.0],
                            "delta_mean": [3.2e-5], "delta_std": [1.5e-5]})
    shown = cnn.display_table(summary, {"changed": "changed", "delta": "max |ΔW|"}, ["method"],
                                    counts=["changed"])
    assert shown.loc["naive", "changed"] == "7,326,424 ± 79,581"
    assert shown.loc["naive", "max |ΔW|"] == "3.2e-5 ± 1.5e-5"  # no e-05
    steps = _steps_table(True).replace({"method": {"naive": "reset"}})
    contrast = cnn.hold_vs_reset(steps)
    assert list(contrast.columns) == list(cnn.HOLD_VS_RESET_COLUMNS)
    shown = cnn.hold_vs_reset_display(contrast).iloc[0]
    assert shown["differs (interval leaves out 0)"] == "no" and shown["hold − reset"] == "+0.000"
    assert shown["95% interval (paired by seed)"] == "+0.000 to +0.000" and shown["seeds hold higher"] == "0 of 2"


def test_one_step_audit_counts_what_could_and_did_move():
    before = [np.zeros(6, np.float32)]
    after = [np.array([0, 1, 0, 0, 0, 2], np.float32)]
    keeps = [np.array([True, False, False, False, True, True])]  # entries 1-3 frozen in this step
    previous = [np.array([False, True, True, False, False, False])]  # 1 and 2 trained in the step before
    moment = [np.array([False, True, False, False, False, True])]  # only 1 had a non-zero gradient then
    row = cnn.one_step_audit(before, after, keeps, previous, moment)
    assert row == {"frozen entries": 3, "of them trainable in the step before": 2,
                   "of them with m ≠ 0 before the step": 1, "frozen entries changed in the step": 1,
                   "max |ΔW| of a frozen entry": 1.0}
    assert cnn.one_step_audit(before, before, keeps, None, [np.zeros(6, bool)])[
        "of them trainable in the step before"] == 0


def test_step_times_name_the_slowest_method_only_where_every_run_agrees():
    steps = _steps_table(True)
    slow = steps.assign(step_time_ms=steps["step_time_ms"] + 5 * (steps["method"] == "naive"))
    times = cnn.step_times(slow)
    assert times["pairs"] == 2 and times["slowest_runs"] == {"naive": 2, "hold": 0} and times["about_equal_runs"] == 0
    assert times["slowest_every_mean"] == "naive" and times["methods"]["naive"]["runs"] == 2
    assert times["methods"]["naive"]["mean"] == pytest.approx(17.5) and times["methods"]["hold"]["std"] == 0
    mixed = slow.copy()
    mixed.loc[(mixed["method"] == "hold") & (mixed["seed"] == 1), "step_time_ms"] += 100  # hold slowest in seed 1
    assert cnn.step_times(mixed)["slowest_runs"] == {"naive": 1, "hold": 1}


def test_a_step_slower_by_less_than_the_timing_tolerance_is_about_equal_not_the_slowest():
    steps = _steps_table(True)
    # naive 1.5% slower than hold in seed 0 (within TIMING_TOLERANCE), 5% in seed 1
    factor = np.where(steps["method"] == "naive", np.where(steps["seed"] == 0, 1.015, 1.05), 1.0)
    times = cnn.step_times(steps.assign(step_time_ms=steps["step_time_ms"] * factor))
    assert times["slowest_runs"] == {"naive": 1, "hold": 0} and times["about_equal_runs"] == 1
    assert times["tolerance"] == prose.TIMING_TOLERANCE and times["slowest_every_mean"] == "naive"  # mean 3.25%
    close = cnn.step_times(steps.assign(step_time_ms=steps["step_time_ms"] * np.where(
        steps["method"] == "naive", 1.015, 1.0)))
    assert close["slowest_runs"] == {"naive": 0, "hold": 0} and close["slowest_every_mean"] == ""


def test_hold_against_reset_counts_a_difference_only_where_its_paired_interval_leaves_out_zero():
    import pandas as pd

    def table(hold: list[float], reset: list[float]) -> pd.DataFrame:
        """A steps table of one p: each policy's final accuracy per seed (seeds 0, 1, 2)."""
        return pd.DataFrame([{"experiment": "x", "optimizer": "adam", "method": method, "seed": seed, "p": 0.5,
                              "step": step, "loss": 1.0, "frozen_entries": 10, "frozen_changed": 0,
                              "frozen_max_abs_delta": 0.0, "step_time_ms": 10.0,
                              "accuracy": accuracy if step == 2 else np.nan}
                             for method, values in (("hold", hold), ("reset", reset))
                             for seed, accuracy in enumerate(values) for step in (1, 2)])

    # the committed run's p = 0.5: hold higher in every seed by 0.062, 0.010, 0.074; 3 seeds cannot tell
    loose = cnn.hold_vs_reset(table([0.70, 0.71, 0.72], [0.638, 0.70, 0.646])).iloc[0]
    mean, low, high = intervals.t_interval([0.062, 0.010, 0.074])
    assert loose["hold minus reset"] == pytest.approx(mean)
    assert loose["hold minus reset interval low"] == pytest.approx(low)
    assert low < 0 < high and not loose["differs"] and loose["seeds hold higher"] == 3 and loose["seeds"] == 3
    tight = cnn.hold_vs_reset(table([0.70, 0.71, 0.72], [0.65, 0.659, 0.671])).iloc[0]
    assert tight["differs"] and tight["hold minus reset interval low"] > 0
    worse = cnn.hold_vs_reset(table([0.65, 0.659, 0.671], [0.70, 0.71, 0.72])).iloc[0]
    assert worse["differs"] and worse["hold minus reset interval high"] < 0 and worse["seeds hold higher"] == 0


def test_the_naive_and_hold_tables_print_a_mean_as_the_summary_table_does():
    summary = cnn.masked_summary(_steps_table(True))
    summary.loc[summary["method"] == "hold", ["accuracy_mean", "accuracy_std"]] = [0.8473, 0.0012]  # needs 4 decimals
    decimals = reporting.column_decimals(summary, ["accuracy"])["accuracy"]
    assert decimals == 4
    shown = cnn.display_table(summary, {"accuracy": "accuracy"}, ["method"])
    steps = _steps_table(True)
    steps.loc[(steps["method"] == "hold") & (steps["step"] == 3), "accuracy"] = [0.8464515, 0.8481485]  # 0.8473±0.0012
    assert cnn.masked_summary(steps)["accuracy_mean"].tolist() == pytest.approx(summary["accuracy_mean"].tolist())
    trade = cnn.naive_vs_exact_display(cnn.naive_vs_exact(steps), summary).iloc[0]
    assert trade["naive accuracy (mean ± std)"] == shown.loc["naive", "accuracy"] == "0.5500 ± 0.0707"
    assert trade["hold accuracy (mean ± std)"] == shown.loc["hold", "accuracy"] == "0.8473 ± 0.0012"
    assert trade["naive minus hold"] == "−0.2973"
    # the interval's ends, rounded outward (the lower toward -inf, the upper toward +inf)
    low, high = intervals.t_interval([0.5 - 0.8464515, 0.6 - 0.8481485])[1:]
    assert trade["95% interval (paired by seed)"] == (f"{prose.signed(low, decimals=4, rounding='floor')} to "
                                                       f"{prose.signed(high, decimals=4, rounding='ceil')}")
    contrast = cnn.hold_vs_reset(steps.replace({"method": {"naive": "reset"}}))
    assert cnn.hold_vs_reset_display(contrast, summary).iloc[0]["hold"] == "0.8473"


def test_a_count_range_shows_one_number_where_every_seed_agrees():
    import pandas as pd

    rows = pd.DataFrame([{"optimizer": "sgd", "method": "trainable_no_recompile", "seed": s, "acc_new": 0.9,
                          "acc_old": 0.0, "conv_max_abs_delta": 0.1, "conv_changed_entries": c, "step_time_ms": 1.0}
                         for s, c in ((0, 52095), (1, 52096), (2, 52096))])
    summary = cnn.finetune_summary(rows)
    assert set(summary.columns) == set(cnn.FINETUNE_SUMMARY_COLUMNS)
    shown = cnn.display_table(summary, ["acc_new"], ["method"], counts={"conv_changed_entries": "changed"})
    assert shown.iloc[0]["changed"] == "52,095–52,096" == reporting.count_range(52095, 52096)


@pytest.mark.slow  # pretrains and fine-tunes the 3.3M-parameter CNN twice (a minute or more on 2 cores)
def test_masked_skip_fine_tunes_as_recompiling_with_trainable_false_does_and_keeps_every_conv_bit():
    from study.cnn.finetune import finetune_study
    from study.data import load_mnist  # the bundled digits: offline
    config = cnn.CnnStudyConfig(seeds=[0], finetune_optimizers=["adam"], pretrain_steps=3, finetune_steps=3,
                                eval_samples=20, finetune_methods=["trainable_recompile", "masked_skip"])
    data = load_mnist(train_limit=400)
    rows = finetune_study(config, data, progress=False).set_index("method")
    assert rows.loc["masked_skip", "conv_changed_entries"] == 0
    assert rows.loc["masked_skip", "acc_new"] == rows.loc["trainable_recompile", "acc_new"]
    assert rows.loc["masked_skip", "acc_old"] == rows.loc["trainable_recompile", "acc_old"]


def test_summary_rows_give_each_paired_difference_with_its_interval_and_verdict():
    import pandas as pd

    steps = _steps_table(True)  # naive 0.5 / 0.6 and hold 0.5 / 0.6 by seed: identical in every seed
    blocks = _steps_table(False)
    finetune = pd.DataFrame([{"optimizer": "adam", "method": "var_list", "seed": s, "acc_new": 0.9, "acc_old": 0.0,
                              "conv_max_abs_delta": 0.0, "conv_changed_entries": 0, "step_time_ms": 1.0}
                             for s in (0, 1)])
    head = cnn.headline(cnn.CnnStudyConfig(seeds=[0, 1]), cnn.finetune_summary(finetune),
                        pd.DataFrame(columns=list(cnn.TRAP_COLUMNS)), cnn.masked_summary(steps),
                        cnn.masked_summary(blocks), "synthetic", mask_steps=steps, block_steps=blocks)
    row = "masks p=0.5 adam: naive minus hold, final test accuracy (mean over seeds; 95% interval, paired by seed)"
    assert head[row].endswith("identical in every seed)")
    apart = steps.copy()
    apart.loc[(apart["method"] == "naive") & (apart["step"] == 3), "accuracy"] = [0.71, 0.8]  # +0.21, +0.20
    head = cnn.headline(cnn.CnnStudyConfig(seeds=[0, 1]), cnn.finetune_summary(finetune),
                        pd.DataFrame(columns=list(cnn.TRAP_COLUMNS)), cnn.masked_summary(apart),
                        cnn.masked_summary(blocks), "synthetic", mask_steps=apart, block_steps=blocks)
    assert head[row].endswith("; leaves out zero)") and head[row].startswith("+0.2")
    assert "blocks adam: hold minus naive, final test accuracy" in " | ".join(head)
