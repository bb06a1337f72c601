"""pslat's command line: the root that composes the agent, the reports, the cluster and
the workloads (agent/ imports none of reports/ and workloads/; this does)."""
