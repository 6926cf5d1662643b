"""Study 02's building blocks: configuration errors, mask schedules, the Keras trainable traps."""

import numpy as np
import pytest
import tensorflow as tf

from study import cnn_study
from study.models import deep_mnist_cnn


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
    ({"learning_rates": {"sgd": 0.1}}, r"learning_rates: no rate for \['adam', 'adamw', 'momentum'\]"),
    ({"allow_download": "yes"}, "allow_download: expected true or false"),
])
def test_bad_parameters_fail_before_training(bad, match):
    with pytest.raises(ValueError, match=match):
        cnn_study.CnnStudyConfig(**bad)


def test_random_masks_are_reproducible_fresh_each_step_and_about_p():
    variables = deep_mnist_cnn().trainable_variables
    a = cnn_study.random_masks(variables, tf.constant(3, tf.int64), 0.25, tf.constant(7, tf.int64))
    b = cnn_study.random_masks(variables, tf.constant(3, tf.int64), 0.25, tf.constant(7, tf.int64))
    c = cnn_study.random_masks(variables, tf.constant(4, tf.int64), 0.25, tf.constant(7, tf.int64))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[4], c[4])
    fc1 = a[4].numpy()
    assert fc1.shape == (3136, 1024) and abs(fc1.mean() - 0.25) < 0.01


def test_block_masks_train_one_layer_at_a_time():
    variables = deep_mnist_cnn().trainable_variables
    schedule = cnn_study.block_masks(every=2)
    active = [[bool(m) for m in schedule(variables, tf.constant(s, tf.int64), 0.0, 0)] for s in range(10)]
    assert active[0] == [True, True, False, False, False, False, False, False]  # conv1 kernel and bias
    assert active[2] == [False, False, True, True, False, False, False, False]  # conv2
    assert active[6] == [False] * 6 + [True, True]  # fc2
    assert active[8] == active[0]  # and round again


def test_keras_trainable_traps_are_as_the_guide_reports():
    traps = cnn_study.keras_trainable_traps().set_index("scenario")
    assert traps.iloc[0]["trained"] is True  # frozen without recompiling: still trains
    assert traps.iloc[1]["trained"] is False  # recompiled: frozen
    assert traps.iloc[2]["trained"] is False  # unfrozen without recompiling: silently does not train
    assert traps.iloc[3]["error"].startswith("Unknown variable")
