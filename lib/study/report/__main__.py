"""``python -m study.report``: the pipeline's command line (``study.report.pipeline.main``)."""

import sys

from study.report.pipeline import main

sys.exit(main())
