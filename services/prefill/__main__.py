"""``python -m services.prefill``: a worker process in the prefill role."""

import sys

from services.worker.main import main

sys.exit(main(role="prefill"))
