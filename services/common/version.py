"""The installed Seawall version, reported by every service (WorkerInfo.version, /v1/models)."""

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("seawall")
except PackageNotFoundError:  # running from a checkout that was never installed
    VERSION = "0+unknown"
