"""The Keras optimizer surface of ``MaskedOptimizer``, forwarded to the optimizer it wraps.

Keras code and callbacks read attributes straight off ``model.optimizer``: ``LearningRateScheduler``
and ``ReduceLROnPlateau`` the learning rate, ``TensorBoard`` too, ``SwapEMAWeights`` ``use_ema`` and the
averages, ``LossScaleOptimizer`` and ``MultiOptimizer`` ``loss_scale_factor``, Keras' own tests
``_clip_gradients``, ``initial_scale`` and ``optimizers`` (the private names are those of ``freezing._keras_api``).
A wrapper that answered with its own defaults would silently switch those features off, so, as in Keras'
``LossScaleOptimizer``, every option of the inner optimizer is read and written through, and any other attribute the
wrapper does not have is
looked up on the inner optimizer. Keras' per-variable ``update_step`` and its weight decay, called on the
wrapper, run the inner optimizer's with the stored masks in force.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from freezing import _keras_api

FORWARDED = {
    "use_ema": False, "ema_momentum": 0.99, "ema_overwrite_frequency": None, "clipnorm": None,
    "global_clipnorm": None, "clipvalue": None, "weight_decay": None, "gradient_accumulation_steps": None,
    "loss_scale_factor": None, _keras_api.ITERATIONS: None,
}
"""The inner optimizer's options a wrapper reads and writes through, with Keras' defaults (what the
wrapper answers while it is being constructed and while Keras builds its own, unused, state). The step
counter ``_iterations`` is Keras' own name for it, read by its tests and callbacks."""


def _forward(name: str, default: Any) -> property:
    def get(self: Any) -> Any:
        inner = self.__dict__.get("inner")
        if inner is None or self.__dict__.get("_own_defaults"):
            return default
        return getattr(inner, name)

    def set_(self: Any, value: Any) -> None:
        inner = self.__dict__.get("inner")
        if inner is not None:  # Keras' base __init__ sets every option before there is an inner optimizer
            setattr(inner, name, value)

    return property(get, set_, doc=f"The inner optimizer's ``{name}`` (read and written through).")


class InnerSurface:
    """Mixin: the inner optimizer's options, learning rate, counters and unknown attributes, seen through a wrapper."""

    inner: Any

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("inner")
        if inner is None or name.startswith("__") or name in ("inner", "_own_defaults"):
            raise AttributeError(name)
        return getattr(inner, name)

    @property
    def learning_rate(self) -> Any:
        """The inner optimizer's learning rate; setting it sets the inner one's.

        >>> import keras; from freezing import MaskedOptimizer
        >>> opt = MaskedOptimizer(keras.optimizers.SGD(0.1)); opt.learning_rate = 0.5
        >>> float(opt.inner.learning_rate.numpy())
        0.5
        """
        inner = self.__dict__.get("inner")
        return 0.0 if inner is None else inner.learning_rate

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        inner = self.__dict__.get("inner")
        if inner is not None:
            inner.learning_rate = value

    @property
    def iterations(self) -> Any:
        """The inner optimizer's step counter (what ``mask_fn`` receives as ``step``).

        >>> import keras, numpy as np; from freezing import MaskedOptimizer
        >>> w = keras.Variable([1.0], name="w"); opt = MaskedOptimizer("sgd")
        >>> _ = opt.apply_gradients([(np.float32([1.0]), w)]); int(opt.iterations.numpy())
        1
        """
        return self.inner.iterations

    def scale_loss(self, loss: Any) -> Any:
        """Forward loss scaling to the inner optimizer (a ``LossScaleOptimizer`` multiplies it).

        >>> import keras; from freezing import MaskedOptimizer
        >>> opt = MaskedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(), initial_scale=8.0))
        >>> float(opt.scale_loss(2.0))
        16.0
        """
        return self.inner.scale_loss(loss)

    def _clip_through(self, grads: Sequence[Any]) -> Any:
        """The inner optimizer's gradient clipping (what Keras calls as ``_clip_gradients`` on the wrapper).

        >>> import keras, numpy as np; from freezing import MaskedOptimizer
        >>> opt = MaskedOptimizer(keras.optimizers.SGD(clipvalue=0.5))
        >>> [g.numpy().tolist() for g in opt._clip_through([np.float32([2.0, -0.1])])]
        [[0.5, -0.10000000149011612]]
        """
        return _keras_api.clip_gradients(self.inner, grads)

    def exclude_from_weight_decay(self, var_list: Sequence[Any] | None = None,
                                  var_names: Sequence[str] | None = None) -> None:
        """Exclude variables from the inner optimizer's weight decay (every optimizer of a ``MultiOptimizer``).

        Args:
            var_list: variables to exclude.
            var_names: substrings: a variable whose name contains one is excluded.

        >>> import keras, numpy as np; from freezing import MaskedOptimizer
        >>> bias, kernel = keras.Variable([1.0], name="bias"), keras.Variable([1.0], name="kernel")
        >>> opt = MaskedOptimizer(keras.optimizers.AdamW(1.0, weight_decay=0.1))
        >>> opt.exclude_from_weight_decay(var_names=["bias"])
        >>> _ = opt.apply_gradients([(np.zeros(1, "float32"), bias), (np.zeros(1, "float32"), kernel)])
        >>> bias.numpy().tolist(), kernel.numpy().tolist()  # only the kernel decayed
        ([1.0], [0.8999999761581421])
        """
        for leaf in self._leaves():
            leaf.exclude_from_weight_decay(var_list=var_list, var_names=var_names)
        self._sparse.excluded = (list(var_list or []), var_names)  # state="sparse": its scratch values too, at build

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        """Keras' per-variable update, by the inner optimizer that updates ``variable``, with its stored mask in force.

        ``apply`` is what training calls; this is for code that drives one variable's update itself.

        >>> import keras, numpy as np; from freezing import MaskedOptimizer
        >>> w = keras.Variable([1.0, 2.0], name="w"); opt = MaskedOptimizer(keras.optimizers.SGD()); opt.build([w])
        >>> opt.set_mask(w, [True, False]); opt.update_step(np.float32([1.0, 1.0]), w, 0.5); w.numpy().tolist()
        [0.5, 2.0]
        """
        leaf = next((o for o in self._leaves() if _keras_api.knows(o, variable)), self._leaves()[0])
        entries, _ = self._entries([variable], None, mask_fn=False)
        self._guarded(entries, lambda: leaf.update_step(gradient, variable, learning_rate), "update_step")

    def _decay_through(self, variables: Sequence[Any]) -> None:
        """The inner optimizers' weight decay (their own rule: Muon's too), with the stored masks in force (what
        Keras calls as ``_apply_weight_decay`` on the wrapper).

        >>> import keras, numpy as np; from freezing import MaskedOptimizer
        >>> w = keras.Variable([1.0, 1.0], name="w")
        >>> opt = MaskedOptimizer(keras.optimizers.AdamW(1.0, weight_decay=0.5))
        >>> opt.build([w]); opt.set_mask(w, [True, False]); opt._decay_through([w]); w.numpy().tolist()
        [0.5, 1.0]
        """
        entries, _ = self._entries(list(variables), None, mask_fn=False)

        def decay() -> None:
            for leaf in self._leaves():
                _keras_api.apply_weight_decay(
                    leaf, [v for v in variables if _keras_api.knows(leaf, v)] if leaf.built else variables)

        self._guarded(entries, decay, "weight decay")

    def _leaves(self) -> list[Any]:  # pragma: no cover - defined by the wrapper
        raise NotImplementedError

    def _entries(self, variables: list[Any], masks: Any, mask_fn: bool = True) -> tuple[dict, dict]:  # pragma: no cover
        raise NotImplementedError

    def _guarded(self, entries: dict, write: Any, who: str) -> None:  # pragma: no cover - defined by the wrapper
        raise NotImplementedError


for _name, _default in FORWARDED.items():
    setattr(InnerSurface, _name, _forward(_name, _default))
setattr(InnerSurface, _keras_api.CLIP_GRADIENTS, InnerSurface._clip_through)  # Keras' private names
setattr(InnerSurface, _keras_api.APPLY_WEIGHT_DECAY, InnerSurface._decay_through)
