"""The README's headline claims hold in the committed results (``results/``, made by ``make reproduce``).

The reports check their own prose when they are rendered; the README is written by hand, so its headings are
checked here against the same ``metrics.json`` files. A rerun whose results contradict a heading fails this.
"""

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
README = (REPO / "README.md").read_text(encoding="utf-8")

# README figure 1: "those whose state only scales the gradient (RMSprop without momentum, Adagrad, Adadelta) and
# plain SGD do not, nor does Ftrl" (a zero gradient leaves its z and n unchanged); every other optimizer of study 01
# (momentum, first moment or weight decay) does.
KEEP_STILL = {"sgd", "rmsprop", "adagrad", "adadelta", "ftrl"}


def _metrics(study: str) -> dict:
    path = RESULTS / study / "metrics.json"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make reproduce` and commit results/")
    return json.loads(path.read_text())


def test_figure_1_which_optimizers_move_frozen_entries_under_the_mask_alone():
    assert re.search(r"RMSprop without\s+momentum, Adagrad, Adadelta\) and plain SGD do not, nor does Ftrl,", README)
    drift = _metrics("01_adam_drift")["drift"]
    optimizers = {key.split("/")[0] for key in drift}
    assert KEEP_STILL < optimizers and len(optimizers) > len(KEEP_STILL)
    for name in optimizers:
        moved = drift[f"{name}/naive"]["changed_entries_sum_mean"]
        assert (moved == 0) == (name in KEEP_STILL), (name, moved)
        for policy in ("hold", "reset"):  # "MaskedOptimizer moves none under any of them"
            assert drift[f"{name}/{policy}"]["changed_entries_sum_mean"] == 0, (name, policy)


def test_figure_3_pruned_weights_stay_zero_with_the_exact_mask_and_the_constraint_only():
    assert re.search(r"stay zero with the exact mask\s+and with a re-zeroing constraint", README)
    by = _metrics("05_recipes")["pruning"]["by_optimizer"]  # per optimizer/method/sparsity
    assert any(key.startswith("adam/exact/") for key in by)
    for key, row in by.items():
        if "/exact/" in key or "/constraint/" in key:
            assert row["moved_max"] == 0, (key, row)
        if key.startswith("adam/gradient_mask/"):  # "a gradient mask alone lets Adam move nearly all of them"
            assert row["moved_min"] > 0.5 * row["pruned"], (key, row)


def test_figure_2_the_naive_mask_drifts_under_adam_and_hold_reset_do_not():
    masks = _metrics("02_mnist_cnn_freezing")
    text = json.dumps(masks)
    assert "naive" in text and "hold" in text
    summary = {k: v for k, v in masks.get("headline", {}).items() if k.startswith("masks p=")}
    assert summary, "study 02's headline has no mask rows"
    for key, value in summary.items():
        moved = value.split(" / ")[-1].split(" ± ")[0].replace(",", "")
        if "adam/naive" in key:
            assert float(moved) > 0, (key, value)
        elif "/hold" in key or "/reset" in key:
            assert float(moved) == 0, (key, value)


def test_figure_4_a_second_worker_makes_pushes_about_one_update_stale_and_loses_nothing():
    assert re.search(r"second worker, pushes arrive about one update stale, and in the fault-free runs nothing a "
                     r"worker returned is lost; a killed ps task loses the updates applied since its last checkpoint",
                     README.replace("\n", " "))
    runs = _metrics("04_gradients_and_ps")["ps"]
    assert runs["1"]["staleness_mean"] == 0
    assert 0.5 <= runs["2"]["staleness_mean"] <= 1.5
    table = (RESULTS / "04_gradients_and_ps" / "ps_runs.csv").read_text().splitlines()
    rows = [dict(zip(table[0].split(","), line.split(","))) for line in table[1:]]
    assert {row["workers"] for row in rows} == {"1", "2"}
    for row in rows:  # one applied update per n_push steps of every worker: every push was applied
        assert int(row["applied_updates"]) * int(row["n_push"]) == int(row["steps"]), row
