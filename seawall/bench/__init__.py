"""``seawall bench``: load against a live mesh, client-side latency metrics, policy comparisons and reports.

* ``arrivals``: when requests arrive (Poisson, gamma, on/off from ``seawall.sim.workloads``; fixed-size bursts);
* ``workload``: what they ask for (synthetic token ids; fixed, Pareto or trace lengths; the burst scenario);
* ``runner``: the async load generator (gRPC or the OpenAI HTTP API), with a stats poller and a progress bar;
* ``metrics``: per-request timelines and their summaries (TTFT, TBT, stalls around bursts, goodput);
* ``capacity``: the highest rate within the SLOs (Sarathi-Serve's capacity search);
* ``session``: one benchmark end to end (spawn a mesh per policy, sweep rates, the transformers baseline);
* ``report``/``svg``: the table, the JSON and the HTML report; ``hf_baseline``: the transformers peer.
"""
