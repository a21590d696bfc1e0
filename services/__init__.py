"""Seawall's services: scheduler, prefill, decode and kvcache, plus the engine and common edges they share."""
