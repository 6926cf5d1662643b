"""Select variables by scope or pattern: TF2's ``tf.get_collection(TRAINABLE_VARIABLES, scope)``.

An empty ``var_list`` silently trains nothing, which is the classic freezing bug, so a selection
that matches nothing raises and lists the prefixes that do exist.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

import tensorflow as tf


def variable_path(variable: Any) -> str:
    """Return the slash-separated path of a Keras or TF variable, without TF's ``:0`` suffix.

    Keras 3 variables have a ``path`` (``"fc1/kernel"``, or ``"model/fc1/kernel"`` inside a model
    with an input); plain ``tf.Variable`` objects only have a ``name`` (``"w:0"``), from which the
    output index is dropped. This is the string that ``select_variables`` matches scopes and patterns
    against, and the name ``FreezeAudit`` records.

    Args:
        variable: a ``keras.Variable``, a ``tf.Variable``, or anything with a ``path`` or ``name``.

    Returns:
        The path, such as ``"fc1/kernel"`` or ``"w"``.

    Example:
        >>> import keras
        >>> import tensorflow as tf
        >>> layer = keras.layers.Dense(2, name="fc1")
        >>> layer.build((None, 3))
        >>> variable_path(layer.kernel)
        'fc1/kernel'
        >>> variable_path(tf.Variable([1.0, 2.0], name="w"))
        'w'
    """
    path = getattr(variable, "path", None)
    if path is None:
        path = variable.name
    return path[:-2] if path.endswith(":0") else path


def _all_variables(source: Any, trainable_only: bool) -> list[Any]:
    if isinstance(source, tf.Module) or hasattr(source, "trainable_variables"):
        return list(source.trainable_variables if trainable_only else source.variables)
    if isinstance(source, Iterable) and not isinstance(source, (str, bytes)):
        variables = list(source)
        return [v for v in variables if getattr(v, "trainable", True)] if trainable_only else variables
    raise TypeError(
        f"source: expected a Keras layer or model, a tf.Module, or an iterable of variables; "
        f"got {type(source).__name__}"
    )


def _prefixes(paths: Iterable[str], depth: int) -> str:
    counts = Counter("/".join(p.split("/")[:depth]) for p in paths)
    return ", ".join(f"{prefix}/ ({n})" for prefix, n in sorted(counts.items()))


def select_variables(
    source: Any,
    scope: str | None = None,
    pattern: str | None = None,
    trainable_only: bool = True,
) -> list[Any]:
    """Return the variables of ``source`` under ``scope`` whose path matches ``pattern``.

    TF2's ``tf.get_collection(TRAINABLE_VARIABLES, scope)``: ``select_variables(gan,
    scope="generator/")`` is every trainable variable whose path is ``generator/...``, ready to
    pass as the ``var_list`` of an optimizer. ``scope`` is a path prefix, absolute or relative to
    ``source`` (Keras 3 paths read ``model/layer/var``), and matches whole path components
    (``"gen"`` does not match ``"generator"``); leading and trailing slashes are ignored.
    ``pattern`` is a regular expression searched (``re.search``) in the path. With both, a variable
    must satisfy both. The variables keep the order of ``source``.

    Args:
        source: a Keras layer or model, a ``tf.Module``, or an iterable of variables.
        scope: path prefix to select, or None for every variable.
        pattern: regular expression the path must contain, or None.
        trainable_only: if True (the default), only trainable variables are considered, as with
            ``TRAINABLE_VARIABLES``; if False, every variable (batch-norm statistics included).

    Returns:
        A non-empty list of the matching variables.

    Raises:
        ValueError: when nothing matches (an empty ``var_list`` would silently train nothing); the
            message names the scope and pattern and lists the prefixes that exist, or says that
            the source has no (trainable) variables, or is not built yet.
        TypeError: when ``source`` is none of the accepted kinds.
        re.error: when ``pattern`` is not a valid regular expression.

    Example:
        >>> import keras
        >>> net = keras.Sequential(
        ...     [keras.Input((3,)), keras.layers.Dense(4, name="g1"), keras.layers.Dense(1, name="d1")],
        ...     name="net")
        >>> [variable_path(v) for v in select_variables(net, scope="g1")]
        ['net/g1/kernel', 'net/g1/bias']
        >>> [variable_path(v) for v in select_variables(net, pattern=r"/kernel$")]
        ['net/g1/kernel', 'net/d1/kernel']
        >>> select_variables(net, scope="g")
        Traceback (most recent call last):
        ...
        ValueError: select_variables: scope='g' pattern=None matched none of 4 trainable variables;
        available prefixes: d1/ (2), g1/ (2)
    """
    variables = _all_variables(source, trainable_only)
    if not variables:
        what = "trainable variables" if trainable_only else "variables"
        hint = ""
        if trainable_only and getattr(source, "variables", None):
            hint = " (it has variables, but none is trainable: is `trainable=False` set on it?)"
        elif not getattr(source, "variables", None) and hasattr(source, "built"):
            hint = " (is the model built? call it once on an input first)"
        raise ValueError(f"select_variables: the source has no {what}{hint}")
    regex = re.compile(pattern) if pattern is not None else None
    prefix = scope.strip("/") if scope else None
    own = f"{source.name}/" if isinstance(getattr(source, "name", None), str) else None

    def in_scope(path: str) -> bool:
        # a scope is a path prefix, absolute or relative to the source (Keras nests "model/layer/var")
        candidates = [path, path[len(own):]] if own and path.startswith(own) else [path]
        return any(p == prefix or p.startswith(prefix + "/") for p in candidates)

    chosen = []
    for v in variables:
        path = variable_path(v)
        if prefix is not None and not in_scope(path):
            continue
        if regex is not None and not regex.search(path):
            continue
        chosen.append(v)
    if not chosen:
        paths = [variable_path(v) for v in variables]
        if own and all(p.startswith(own) for p in paths):
            paths = [p[len(own):] for p in paths]
        depth = prefix.count("/") + 1 if prefix else 1
        raise ValueError(
            f"select_variables: scope={scope!r} pattern={pattern!r} matched none of {len(paths)} "
            f"{'trainable ' if trainable_only else ''}variables; available prefixes: {_prefixes(paths, depth)}"
        )
    return chosen
