"""The Deep MNIST CNN: pinned parameter count and scope-selectable layer names (flax-style smoke test)."""

import numpy as np

from freezing import select_variables, variable_path
from freezing.models import DEEP_MNIST_PARAMETERS, deep_mnist_cnn


def test_deep_mnist_cnn_parameter_count_and_scopes():
    model = deep_mnist_cnn()
    assert model.count_params() == DEEP_MNIST_PARAMETERS == 3_274_634
    conv1 = ["deep_mnist_cnn/conv1/kernel", "deep_mnist_cnn/conv1/bias"]
    assert [variable_path(v) for v in select_variables(model, scope="conv1")] == conv1  # relative to the model
    assert [variable_path(v) for v in select_variables(model, scope="deep_mnist_cnn/conv1")] == conv1  # absolute
    assert len(select_variables(model, pattern="/fc")) == 4
    logits = model(np.zeros((2, 28, 28, 1), np.float32))
    assert tuple(logits.shape) == (2, 10)
