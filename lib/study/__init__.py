"""The freezing study: data, models, training loops, the five experiments, plots, reports and the pipeline.

This package is the harness around the library ``freezing``; it is what ``make reproduce`` runs, and it
needs the ``study`` extra (``pip install -e .[study]``: pandas, matplotlib, papermill, mlxtend, ...).
A Keras user who only wants to freeze parameters imports ``freezing`` and never this package.

* ``data``, ``models``, ``training``  -- offline MNIST, the Deep MNIST CNN, the masked training loop.
* ``adam_drift``, ``cnn_study``, ``gan_study``, ``gradient_study`` -- one module per notebook.
* ``ps``                              -- an asynchronous parameter server (Downpour SGD), ``python -m study.ps``.
* ``optimizers``                      -- the study's optimizer table, by name.
* ``plots``, ``reporting``, ``pipeline`` -- figures, tables, metrics.json, papermill runs and reports.
"""
