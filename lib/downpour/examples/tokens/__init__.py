"""A model with an ``Embedding`` and two inputs for the parameter server: token sequences and numeric features,
one TFRecord file per worker, Adam on the ps, and the pre-trained rows of the embedding frozen while the new
tokens' rows train. Walk-through: ``lib/downpour/README.md`` ("A model with an Embedding and two inputs").

* ``data``:  ``python -m downpour.examples.tokens.data FOLDER --workers 2`` writes ``train-0.tfrecord``,
  ``train-1.tfrecord`` and ``test.tfrecord``; ``dataset(split, folder, worker, workers)`` reads them on each worker.
* ``model``: ``build()``, ``{"tokens", "numeric"}`` -> one logit; ``new_tokens_only``, the job's ``masks`` hook.
* ``job.json``: the job, ``DownpourConfig`` fields.
"""

from pathlib import Path

JOB = Path(__file__).with_name("job.json")
"""The example's job file (``DownpourConfig`` fields), shipped with the package."""
