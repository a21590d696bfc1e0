"""``python -m services.worker``: a worker process in the role given by --role."""

import sys

from services.worker.main import main

sys.exit(main())
