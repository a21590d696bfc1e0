"""``python -m services.decode``: a worker process in the decode role."""

import sys

from services.worker.main import main

sys.exit(main(role="decode"))
