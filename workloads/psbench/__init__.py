"""psbench: a ps-lite-compatible sparse parameter-server job (scheduler, servers
holding embedding shards, workers pulling and pushing Zipf-distributed keys)
that logs its own ground truth. See README.md in this folder.

Python API: launch_local / launch_in_cluster -> Job (workloads.psbench.launch),
summarize / summary_table (workloads.psbench.summary), read_truth
(workloads.psbench.truth).
"""
