"""Prefill worker: the Worker service in the prefill role (``python -m services.prefill``)."""
