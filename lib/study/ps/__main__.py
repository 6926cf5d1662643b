"""``python -m study.ps``: every task of a parameter-server job (see ``study.ps.roles``)."""

import sys

from study.ps.roles import main

sys.exit(main())
