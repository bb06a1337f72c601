"""A ps-lite job simulated as the agent would record it, with a known truth: run dirs
for the report's tests and benchmarks (job.py), and what the views need beside
(views.py). Not traffic: nothing here is traced."""
