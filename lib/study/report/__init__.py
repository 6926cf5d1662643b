"""The machinery that turns notebooks into reports: ``python -m study.report --profile full --out results``.

* ``pipeline``: runs each notebook with papermill, moves finished outputs into place, writes the manifest;
* ``cache``: the key of a notebook run: everything it reads, and the machine;
* ``records``: this machine's record of the runs it finished (``build/records/``), which lets one be reused;
* ``execution``: papermill in a thread, signals held while a result is moved into place, the kernel's processes;
* ``provenance``: the key, files and origin of each committed result, and ``--verify``, which checks them at HEAD;
* ``load``: how busy the machine was while a notebook ran (its timings say so);
* ``kinds``: what each value of a ``metrics.json`` is (timing, count, sample, ...), as its study declares it;
* ``reproduction``: how close a rerun came to the committed results, each value compared as its kind
  (``REPRODUCTION.md``);
* ``prose``: findings quoted from the run's ``metrics.json`` (Jinja templates and number filters);
* ``html_report``, ``site``: offline HTML reports and the ``index.html`` over all studies;
* ``reporting``: tables, figures and ``metrics.json`` as a notebook saves them.

Importing this package loads none of them; the studies import ``prose`` and ``reporting`` (which reads ``kinds``) only.
"""
