"""The Deep MNIST CNN: pinned parameter count and scope-selectable layer names (flax-style smoke test)."""

import numpy as np
import tensorflow as tf

from freezing import select_variables, variable_path
from study.models import DEEP_MNIST_PARAMETERS, deep_mnist_cnn, training_flops_per_sample


def test_deep_mnist_cnn_parameter_count_and_scopes():
    model = deep_mnist_cnn()
    assert model.count_params() == DEEP_MNIST_PARAMETERS == 3_274_634
    conv1 = ["deep_mnist_cnn/conv1/kernel", "deep_mnist_cnn/conv1/bias"]
    assert [variable_path(v) for v in select_variables(model, scope="conv1")] == conv1  # relative to the model
    assert [variable_path(v) for v in select_variables(model, scope="deep_mnist_cnn/conv1")] == conv1  # absolute
    assert len(select_variables(model, pattern="/fc")) == 4
    logits = model(np.zeros((2, 28, 28, 1), np.float32))
    assert tuple(logits.shape) == (2, 10)


def test_training_flops_are_counted_from_the_layers_and_agree_with_tf_profiler():
    model = deep_mnist_cnn()
    flops = training_flops_per_sample(model)
    assert 80e6 < flops < 85e6  # about 83 MFLOP per sample, as the CNN study issue says
    forward = tf.function(lambda x: model(x)).get_concrete_function(tf.TensorSpec((1, 28, 28, 1), tf.float32))
    opts = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    opts["output"] = "none"
    profiled = tf.compat.v1.profiler.profile(graph=forward.graph, options=opts).total_float_ops
    counted_forward = (flops + 2 * 627_200) // 3  # 2*MACs: the forward part of the count
    assert abs(profiled - counted_forward) / counted_forward < 0.01  # TF also counts biases and ReLUs
