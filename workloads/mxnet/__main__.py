"""`python -m workloads.mxnet --out DIR [--servers M --workers N --mode ...] [sparse_kv args]`:
run sparse_kv.py over loopback, for debugging without root or a cluster."""
import sys

from .runner import main

sys.exit(main())
