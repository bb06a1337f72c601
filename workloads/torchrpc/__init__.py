"""PyTorch RPC (TensorPipe over TCP) as a real workload: a parameter server in the shape
of PyTorch's RPC parameter-server tutorial (ps.py), placed on the virtual cluster's hosts
(runner.py), in a venv of its own (venv.py, made by scripts/setup_torch.sh)."""
