"""PaddlePaddle's parameter server (fleet, "the_one_ps", brpc's baidu_std) as a real
workload in the virtual cluster: runner.PaddleJob; the job's own counts come from the
trainers' summaries and the servers' brpc /vars (brpc_vars.py). See docs/paddle.md."""
