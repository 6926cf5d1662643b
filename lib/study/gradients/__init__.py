"""Study 04: gradients across a boundary, an asynchronous parameter server, and staleness (notebook
``04_gradients_and_ps``).

* ``config``: ``GradientStudyConfig``, every parameter of the notebook;
* ``fetch``: all gradients in one pass against one per variable, and compute -> transform -> apply, exactly;
* ``ps_tables``: the parameter-server runs (the package ``downpour``) and the fault run as tables;
* ``ps_data``: the study's MNIST as IDX files, the data of every ``downpour`` job here;
* ``staleness``: every gradient applied ``tau`` updates late, in one process;
* ``findings``: the numbers the notebook's findings quote, and its headline;
* ``verdicts``: the staleness gaps' verdicts and their bookkeeping (provisional, repeated, weak, counted);
* ``plots``: the figures.

Modules import ``config`` and never each other in a circle.
"""
