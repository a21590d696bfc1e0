"""Seawall: an LLM serving mesh that stays fast when traffic arrives in bursts.

``seawall.Client`` / ``seawall.AsyncClient`` talk to a running mesh (``seawall up``).
"""

from seawall.client import AsyncClient, BeamHypothesis, Client, Completion

__all__ = ["AsyncClient", "BeamHypothesis", "Client", "Completion"]
