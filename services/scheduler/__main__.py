"""``python -m services.scheduler``: the scheduler process."""

import sys

from services.scheduler.main import main

sys.exit(main())
