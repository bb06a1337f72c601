"""BytePS's own ps-lite (0.2.5.post15's 3rdparty/ps-lite: RawMeta on the wire, answers on
the worker's connection) as a real workload in the virtual cluster: its benchmark
tests/test_benchmark, built by `make setup` (scripts/setup_byteps.sh, build.py), run by
runner.BytepsJob; the job's own log (PS_VERBOSE=2) is the oracle (oplog.py)."""
