"""``python -m services.kvcache``: the KV block store process."""

import sys

from services.kvcache.main import main

sys.exit(main())
