"""``python -m downpour``: every task of a parameter-server job (see ``downpour.roles``)."""

import sys

from downpour.roles import main

sys.exit(main())
