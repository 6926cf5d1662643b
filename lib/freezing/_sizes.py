"""How many bytes a ``MaskedOptimizer`` holds: its masks, all of its state, or one variable's share.

A mixin of ``MaskedOptimizer`` (like ``_surface`` and ``_saving``): the numbers ``make bench`` and the study
report for the memory each way of freezing costs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from freezing import _keras_api
from freezing.slots import slots


class StateSizes:
    """``mask_bytes`` and ``state_bytes``, read off the wrapper's
    variables (its masks, the inner optimizer's, sparse state)."""

    def mask_bytes(self) -> int:
        """Bytes the stored masks take: 1 per stored entry, 1 per variable without a mask (or wholly frozen).

        Returns:
            The total size of the mask variables, in bytes.

        >>> import freezing, keras
        >>> v = keras.Variable(np.zeros((4, 5)), name="w")
        >>> opt = freezing.MaskedOptimizer("adam"); opt.build([v]); opt.mask_bytes()
        1
        >>> opt.set_mask(v, np.random.default_rng(0).random((4, 5)) < 0.5); opt.mask_bytes()
        20
        """
        return int(sum(tf.size(m).numpy() * m.dtype.size for m in self._masks.keep))

    def state_bytes(self, variable: Any = None) -> int:
        """Bytes of optimizer state: all of it, or one variable's (its slots, its mask, its sparse selection).

        The inner optimizer's variables are its slots, step counter and learning rate; with
        ``state="sparse"`` each selection adds K ``int32`` indices and K scratch values.

        Args:
            variable: None for every variable this optimizer holds (the inner optimizer's, the masks,
                sparse state); or a variable (or its path) for that variable's own share: its slots
                (K entries each under ``state="sparse"``), its stored mask (1 byte per stored entry) and
                its sparse indices and scratch values.

        Returns:
            The total, in bytes.

        Raises:
            ValueError: a variable this optimizer was not built with, or a variable before ``build``.

        >>> import freezing, keras
        >>> w = keras.Variable(np.zeros((4, 5), "float32"), name="w")
        >>> opt = freezing.MaskedOptimizer("adam"); opt.build([w])
        >>> opt.state_bytes()  # step 8 + learning rate 4 + m 80 + v 80 + mask 1
        173
        >>> opt.state_bytes(w)  # m 80 + v 80 + its mask 1 (no mask stored: one byte)
        161
        >>> opt.set_mask(w, np.eye(4, 5) > 0); opt.state_bytes(w)  # m 80 + v 80 + its mask 20
        180
        """
        if variable is None:
            variables = self.variables + self._sparse.scratch()
            return int(sum(int(tf.size(v).numpy()) * tf.as_dtype(v.dtype).size for v in variables))
        if not self.built:
            raise ValueError("MaskedOptimizer.state_bytes: build the optimizer first (it holds no state yet)")
        variable = self._resolve(variable)
        held = slots(self, variable)
        total = sum(int(np.prod(s.shape)) * tf.as_dtype(s.dtype).size for s in held.values())
        total += self._sparse.optimizer_bytes({}, variable)  # 0 unless its state is sparse
        keep = self._masks.keep[self._mask_index[_keras_api.key(variable)]]
        return int(total + int(tf.size(keep).numpy()) * keep.dtype.size)
