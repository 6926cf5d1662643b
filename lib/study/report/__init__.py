"""The machinery that turns notebooks into reports: ``python -m study.report --profile full --out results``.

* ``pipeline``: runs each notebook with papermill, moves finished outputs into place, writes the manifest;
* ``cache``: the key of a notebook run and the machine-local record that lets an unchanged notebook be reused;
* ``reproduction``: how close a rerun came to the committed results (``REPRODUCTION.md``);
* ``prose``: findings quoted from the run's ``metrics.json`` (Jinja templates and number filters);
* ``html_report``, ``site``: offline HTML reports and the ``index.html`` over all studies;
* ``reporting``: tables, figures and ``metrics.json`` as a notebook saves them.

Importing this package loads none of them; the studies import ``prose`` and ``reporting`` only.
"""
