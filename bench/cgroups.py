"""cgroup v1 groups for the benchmarks: what each party (the job, the tracer,
the wire forwarder) spends in CPU, and on which CPUs it may run.

These machines mount cgroup v1 with `cpuacct` and `cpuset` as hierarchies of
their own (the cgroup2 mount has no controllers), so a group here is one
directory in each: `cpuacct.usage` is the CPU time (ns) of every task that
was ever in it, counted by the scheduler (user + system, and softirq work
done in those tasks' context: on veth that is the receive path of frames the
task itself sent on), and `cpuset.cpus` pins its tasks. A process joins a
group through `cgroup.procs` (all its threads); children inherit the group
at fork, so a launcher that moves itself in, starts a job and moves itself
back leaves the whole job in the group and nothing else.

The parsers are pure (tests/unit/test_bench_cost.py); the rest needs root.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from core.errors import UserError

CONTROLLERS = ("cpuacct", "cpuset")


def mount_points(mounts_text: str) -> dict[str, Path]:
    """controller -> mount point of its v1 hierarchy, from /proc/mounts."""
    out: dict[str, Path] = {}
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) < 4 or parts[2] != "cgroup":
            continue
        for opt in parts[3].split(","):
            if opt in CONTROLLERS:
                out.setdefault(opt, Path(parts[1]))
    return out


def own_paths(cgroup_text: str) -> dict[str, str]:
    """controller -> the path of the group a process is in, from /proc/PID/cgroup
    ("id:controllers:path" per hierarchy)."""
    out: dict[str, str] = {}
    for line in cgroup_text.splitlines():
        hid, _, rest = line.partition(":")
        ctrls, _, path = rest.partition(":")
        for c in ctrls.split(","):
            if c in CONTROLLERS:
                out[c] = path or "/"
    return out


def pids_of(procs_text: str) -> list[int]:
    return [int(x) for x in procs_text.split() if x.strip().isdigit()]


class Group:
    """One group, the same name in each hierarchy."""

    def __init__(self, name: str, dirs: dict[str, Path]):
        self.name = name
        self.dirs = dirs

    def usage_ns(self) -> int:
        return int((self.dirs["cpuacct"] / "cpuacct.usage").read_text())

    def set_cpus(self, cpus: str) -> None:
        (self.dirs["cpuset"] / "cpuset.cpus").write_text(cpus)

    def cpus(self) -> str:
        return (self.dirs["cpuset"] / "cpuset.cpus").read_text().strip()

    def add(self, pid: int) -> None:
        """Move a process (all its threads) in."""
        for d in self.dirs.values():
            (d / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        return pids_of((self.dirs["cpuacct"] / "cgroup.procs").read_text())


class Groups:
    """A parent group pslat-<tag>-<pid> in each hierarchy with one child per name;
    a context manager that removes them on exit (tasks still in them go back to
    the parent of ours first)."""

    def __init__(self, tag: str, names: tuple[str, ...]):
        mounts = mount_points(Path("/proc/mounts").read_text())
        missing = [c for c in CONTROLLERS if c not in mounts]
        if missing:
            raise UserError(f"no cgroup v1 hierarchy for {', '.join(missing)} in /proc/mounts; this benchmark "
                            "accounts CPU per party with cgroup v1 cpuacct and pins with cpuset")
        own = own_paths(Path("/proc/self/cgroup").read_text())
        self.home = {c: mounts[c] / own.get(c, "/").lstrip("/") for c in CONTROLLERS}
        self.base = {c: self.home[c] / f"pslat-{tag}-{os.getpid()}" for c in CONTROLLERS}
        self.names = names
        self.groups: dict[str, Group] = {}

    def __enter__(self) -> "Groups":
        try:
            for c, d in self.base.items():
                d.mkdir()
            self._inherit_cpuset(self.base["cpuset"], self.home["cpuset"])
            for n in self.names:
                dirs = {c: self.base[c] / n for c in CONTROLLERS}
                for d in dirs.values():
                    d.mkdir()
                self._inherit_cpuset(dirs["cpuset"], self.base["cpuset"])
                self.groups[n] = Group(n, dirs)
        except BaseException:
            self.__exit__()
            raise
        return self

    @staticmethod
    def _inherit_cpuset(child: Path, parent: Path) -> None:
        # a new cpuset is empty: no task may join it before it has CPUs and memory nodes
        for f in ("cpuset.mems", "cpuset.cpus"):
            (child / f).write_text((parent / f).read_text().strip())

    def __getitem__(self, name: str) -> Group:
        return self.groups[name]

    def all_cpus(self) -> str:
        return (self.base["cpuset"] / "cpuset.cpus").read_text().strip()

    @contextmanager
    def joined(self, name: str):
        """This process in group `name` for the block (what it starts stays there)."""
        me = os.getpid()
        self.groups[name].add(me)
        try:
            yield
        finally:
            for c in CONTROLLERS:
                (self.home[c] / "cgroup.procs").write_text(str(me))

    def __exit__(self, *exc) -> None:
        for c in CONTROLLERS:
            base = self.base[c]
            for d in [base / n for n in self.names] + [base]:
                if not d.is_dir():
                    continue
                try:
                    for pid in pids_of((d / "cgroup.procs").read_text()):
                        try:
                            (self.home[c] / "cgroup.procs").write_text(str(pid))
                        except OSError:
                            pass   # exited meanwhile
                    d.rmdir()
                except OSError:
                    pass   # best effort: a leftover empty group harms nothing
