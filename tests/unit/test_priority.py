"""agent.priority: every thread of the agent at --nice N, and back for the stop path;
a bad value is a one-line usage error."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import UserError
from agent.priority import check_nice

ROOT = Path(__file__).resolve().parents[2]

# In a child process, so the test runner keeps its own priority.
CHILD = r"""
import json, os, threading
from agent.priority import Priority

def nices():
    return sorted({int(open(f"/proc/self/task/{t}/stat").read().rsplit(")", 1)[1].split()[16])
                   for t in os.listdir("/proc/self/task")})

stop = threading.Event()
before = threading.Thread(target=stop.wait); before.start()      # a thread from before
p = Priority()
start = nices()
p.set(7)
after = threading.Thread(target=stop.wait); after.start()        # one started after: inherits
lowered = nices()
p.restore()
print(json.dumps([start, lowered, nices()]))
stop.set()
"""


def test_every_thread_lowered_and_restored():
    r = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    start, lowered, restored = json.loads(r.stdout)
    assert lowered == [7] and restored == start


@pytest.mark.parametrize("n", [-21, 20, 100])
def test_out_of_range_is_a_usage_error(n):
    with pytest.raises(UserError, match="--nice"):
        check_nice(n)
