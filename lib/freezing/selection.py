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
    """Return the slash-separated path of a Keras or TF variable. ``variable_path(layer.kernel) == "fc1/kernel"``"""
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

    ``select_variables(gan, scope="generator/")`` -> every trainable variable whose path is
    ``generator/...``. ``scope`` is a path prefix, absolute or relative to ``source`` (Keras 3 paths
    read ``model/layer/var``), and matches whole components ("gen" does not match "generator");
    ``pattern`` is a regular expression searched in the path. Raises ``ValueError`` when nothing
    matches, naming the scope and listing the prefixes that exist.
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
