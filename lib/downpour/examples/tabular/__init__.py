"""A second model for the parameter server: a tabular classifier of breast-cancer biopsies, trained with Adam
on the ps while its first layer stays frozen. Walk-through: ``lib/downpour/README.md``.

* ``data``:  ``python -m downpour.examples.tabular.data FOLDER`` writes ``train.csv`` and ``test.csv``;
  ``dataset(split, folder)`` reads them with ``tf.data.experimental.CsvDataset`` on each worker.
* ``model``: ``build()``, an MLP 30 -> 32 (``encoder``) -> 32 (``hidden``) -> 1 logit (``head``).
* ``job.json``: the job, ``DownpourConfig`` fields.
"""

from pathlib import Path

JOB = Path(__file__).with_name("job.json")
"""The example's job file (``DownpourConfig`` fields), shipped with the package."""
