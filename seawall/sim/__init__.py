"""``seawall sim``: a discrete-event simulator that drives the real scheduler core with a step-time model.

Modules: ``hardware`` (GPUs), ``models`` (model shapes), ``cost_model`` (roofline and measured step times),
``workloads`` (arrival processes and trace lengths), ``loop`` (the event loop around the core), ``metrics``,
``capacity`` (Sarathi-Serve's capacity search) and ``reproduce`` (the paper reproductions). See docs/sim.md.
"""
