"""Decode worker: the Worker service in the decode role (``python -m services.decode``)."""
