"""FreezeAudit and changed_bits: the instrument the studies and the tests rely on."""

import keras
import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from freezing import FreezeAudit, gate
from freezing.audit import changed_bits


def test_changed_bits_sees_sign_of_zero_and_nan():
    before = np.array([0.0, 1.0, np.nan, 2.0], np.float32)
    after = np.array([-0.0, 1.0, np.nan, 2.5], np.float32)
    np.testing.assert_array_equal(changed_bits(before, after), [True, False, False, True])


def test_audit_measures_naive_adam_drift():
    w = tf.Variable([0.0, 0.0, 0.0, 0.0])
    opt = keras.optimizers.Adam(0.1)
    x = tf.constant([1.0, 2.0, 3.0, 4.0])
    audit = FreezeAudit([w], optimizer=opt)
    for keep in ([0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 1.0]):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((gate(w, keep) * x - 1) ** 2)
        grad = tape.gradient(loss, w)
        with audit.step(frozen=[np.asarray(keep) == 0]):
            opt.apply_gradients([(grad, w)])
    table = pd.DataFrame(audit.rows())
    step2 = table[(table["step"] == 1) & (table["tensor"] == "Variable")].iloc[0]
    assert step2["frozen"] == 2 and step2["changed"] == 2
    assert step2["max_abs_delta"] == pytest.approx(0.0670, abs=1e-4)  # 0.1670 - 0.1
    assert audit.changed >= 2
    assert set(table["tensor"]) == {"Variable", "Variable:momentum", "Variable:velocity"}


def test_audit_checks_mask_count():
    audit = FreezeAudit([tf.Variable(1.0)])
    with pytest.raises(ValueError, match="got 2 frozen masks for 1 variables"):
        with audit.step(frozen=[True, True]):
            pass
