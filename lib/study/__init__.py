"""The freezing study: one subpackage per study, each with its own figures, on a small common core.

This package is the harness around the library ``freezing``; it is what ``make reproduce`` runs, and it is its
own project (``lib/pyproject.toml``: pandas, matplotlib, papermill, mlxtend, ...). A Keras user who only wants
to freeze parameters imports ``freezing`` and never this package.

* the core: ``data`` (offline MNIST), ``models`` (the Deep MNIST CNN), ``training`` (loops, snapshots, timing),
  ``optimizers`` (the study's optimizer table, by name), ``processes`` (independent runs in worker processes);
* the studies, one per notebook: ``drift`` (01), ``cnn`` (02), ``gan`` (03), ``gradients`` (04, with the
  parameter server ``downpour``, a package of its own, as a client) and ``recipes`` (05), each with a ``plots`` module;
* ``report``: the pipeline (``python -m study.report``), its cache, the findings' prose, HTML reports and site.

A study imports the core and ``report.prose``/``report.reporting``, never another study; nothing in the core or
in ``report`` imports a study.
"""
