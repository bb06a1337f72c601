"""`pslat report` on hostile run dirs (issue 11, finding 8): every case ends in one line and
exit 2, or in a report that names what it left out; never a traceback, a hang or memory
without bound; and nothing from the run dir reaches the terminal as markup or as escapes.

Each case runs `pslat report` in this process through pslat.cli.main (as a user would,
without the 2 s of a fresh interpreter), except those that could hang or fill memory on
a regression: those run in a child with a time limit and an address-space limit."""
import json
import math
import os
import resource
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_report_bad_input import pristine, run  # noqa: F401  (fixtures: a simulated run of 80 requests)

ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT_S = 60
CHILD_ADDRESS_SPACE_BYTES = 6 << 30   # the report of 80 requests needs far less: urandom would need all


def _edit_meta(run: Path, change, host="ps1") -> Path:
    p = run / host / "meta.json"
    m = json.loads(p.read_text())
    change(m)
    p.write_text(json.dumps(m))
    return p


def _edit_shard(run: Path, change, host="w0") -> Path:
    shard = sorted((run / host).glob("messages-*.parquet"))[0]
    pq.write_table(change(pq.read_table(shard)), shard)
    return shard


def _set_column(t: pa.Table, name: str, values) -> pa.Table:
    return t.set_column(t.schema.get_field_index(name), name, values)


def _report(args, capsys, monkeypatch) -> tuple[int, str, str]:
    """`pslat report ARGS` in this process: (exit status, stdout, stderr)."""
    from pslat import cli

    monkeypatch.setattr(sys, "argv", ["pslat", "report", *map(str, args)])
    with pytest.raises(SystemExit) as e:
        cli.main()
    out, err = capsys.readouterr()
    return e.value.code, out, err


def _child_report(args) -> subprocess.CompletedProcess:
    """`pslat report ARGS` in a child that cannot hang this test or take all memory."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_ADDRESS_SPACE_BYTES, CHILD_ADDRESS_SPACE_BYTES))
    try:
        return subprocess.run([sys.executable, "-m", "pslat.cli", "report", *map(str, args)],
                              capture_output=True, text=True, cwd=ROOT, timeout=CHILD_TIMEOUT_S,
                              preexec_fn=limit, env={**os.environ, "COLUMNS": "100"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"pslat report {' '.join(map(str, args))} still ran after {CHILD_TIMEOUT_S} s")


def _flat(text: str) -> str:
    """The report's text without white space: it wraps long problem lines at 100 columns,
    at a space or (a long path) anywhere."""
    return "".join(text.split())


def _assert_one_line_or_named(rc: int, out: str, err: str, named: str) -> None:
    """Exit 2 with one `pslat: error:` line naming the problem, or a report naming it."""
    assert "Traceback" not in err, err
    if rc == 2:
        assert err.count("\n") == 1 and err.startswith("pslat: error: ") and named in err, err
    else:
        assert rc == 0, err
        assert _flat(named) in _flat(out + err), (named, out[-3000:], err)


# ------------------------------------------------------------------ meta.json fields

META_CASES = {
    # name: (change to ps1's meta.json, what the report must name)
    "counters_list": (lambda m: m.__setitem__("counters", [1, 2]), "counters is a list, not an object"),
    "counters_string": (lambda m: m.__setitem__("counters", "x"), "counters is 'x', not an object"),
    "rows_dropped_many": (lambda m: m["counters"].__setitem__("rows_dropped", "many"),
                          "counters.rows_dropped is 'many', not a count"),
    "clock_x": (lambda m: m.__setitem__("clock", "x"), "clock is 'x', not an object"),
    "started_1e30_float": (lambda m: m.__setitem__("started_realtime_ns", 1e30),
                           "started_realtime_ns is 1e+30, not a time in ns"),
    "started_10_30_int": (lambda m: m.__setitem__("started_realtime_ns", 10**30),
                          "started_realtime_ns is 1000000000000000000000000000000, not a time in ns"),
    "sampling_rate_nan": (lambda m: m.__setitem__("sampling", {"rate": math.nan, "mode": "fixed"}),
                          "sampling.rate is nan, not a rate in (0, 1]"),
    "host_id_number": (lambda m: m.__setitem__("host_id", 7), "host_id is 7, not a string"),
}


@pytest.mark.parametrize("case", sorted(META_CASES))
def test_meta_field_of_the_wrong_type(case, run, capsys, monkeypatch):
    change, named = META_CASES[case]
    meta = _edit_meta(run, change)
    rc, out, err = _report([run], capsys, monkeypatch)
    _assert_one_line_or_named(rc, out, err, named)
    assert rc == 0 and "80 requests paired" in out   # the rest of the run is reported
    assert _flat(str(meta)) in _flat(out)


def test_nan_sampling_rate_in_every_format(run, tmp_path, capsys, monkeypatch):
    """The HTML once formatted the NaN rate into a TypeError (the other formats printed 'nan')."""
    _edit_meta(run, lambda m: m.__setitem__("sampling", {"rate": math.nan, "effective_rate": math.inf}))
    for name in ("r.html", "r.json", "r.txt", "r.trace.json"):
        rc, out, err = _report([run, "-o", tmp_path / name], capsys, monkeypatch)
        assert rc == 0 and "Traceback" not in err and "sampling.rate is nan" in err, (name, err)
        if name in ("r.txt", "r.json"):   # the rate is ignored, not shown or computed with
            text = (tmp_path / name).read_text().replace(str(run), "")   # its name has "nan" in it
            assert "nan" not in _flat(text).lower().replace("sampling.rateisnan", ""), name


def test_meta_nested_100k_deep(run, capsys, monkeypatch):
    from agent.runmeta import MAX_JSON_DEPTH

    meta = run / "ps1" / "meta.json"
    meta.write_text('{"host_id": "ps1", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    rc, out, err = _report([run], capsys, monkeypatch)
    _assert_one_line_or_named(rc, out, err, f"{meta} is nested deeper than {MAX_JSON_DEPTH}")
    assert "80 requests paired" in out and _flat("host id 'ps1' taken from its rows") in _flat(out)


def test_brackets_inside_strings_do_not_nest():
    """The depth bound counts arrays and objects, not brackets in text (a host id, a path)."""
    from agent.runmeta import MAX_JSON_DEPTH
    from agent.safefile import parse_json

    deep_text = {"host_id": "[" * 1000 + '\\"{' * 100, "x": [[["]]]"]]]}
    assert parse_json(json.dumps(deep_text).encode(), MAX_JSON_DEPTH) == deep_text
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_JSON_DEPTH}"):
        parse_json(b'{"a": "]]]]", "b": ' + b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1) + b"}",
                   MAX_JSON_DEPTH)


def test_meta_nested_100k_deep_alone_is_one_line(tmp_path, capsys, monkeypatch):
    from agent.runmeta import MAX_JSON_DEPTH

    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "meta.json").write_text("[" * 100_000 + "]" * 100_000)
    rc, out, err = _report([tmp_path / "h"], capsys, monkeypatch)
    assert rc == 2 and err.count("\n") == 1 and f"nested deeper than {MAX_JSON_DEPTH}" in err, err


# ------------------------------------------------------------------ shard contents

def test_null_host_id_in_rows(run, capsys, monkeypatch):
    shard = _edit_shard(run, lambda t: _set_column(t, "host_id", pa.nulls(len(t), pa.string())))
    rc, out, err = _report([run], capsys, monkeypatch)
    _assert_one_line_or_named(rc, out, err, "rows name no host or another host than 'w0'")
    assert rc == 0 and _flat(str(run / "w0")) in _flat(out)


def test_shard_column_of_the_wrong_type(run, capsys, monkeypatch):
    shard = _edit_shard(run, lambda t: _set_column(t, "ts_framework_ns", pa.array(["x"] * len(t))))
    rc, out, err = _report([run], capsys, monkeypatch)
    _assert_one_line_or_named(rc, out, err, f"{shard}: column ts_framework_ns is string, not int64")
    assert rc == 0 and _flat("shard skipped") in _flat(out)


def test_host_id_column_of_the_wrong_type(run, capsys, monkeypatch):
    shard = _edit_shard(run, lambda t: _set_column(t, "host_id", pa.array([7] * len(t), pa.int64())))
    rc, out, err = _report([run], capsys, monkeypatch)
    _assert_one_line_or_named(rc, out, err, f"{shard}: column host_id is int64, not string")


@pytest.mark.parametrize("value", [-2**63, 2**63 - 1, -1])
def test_timestamp_out_of_range(value, run, capsys, monkeypatch):
    def change(t):
        v = t.column("ts_send_first_enter_ns").to_pylist()
        v[0] = value
        return _set_column(t, "ts_send_first_enter_ns", pa.array(v, pa.int64()))
    shard = _edit_shard(run, change)
    rc, out, err = _report([run], capsys, monkeypatch)
    _assert_one_line_or_named(rc, out, err, f"{shard}: 1 values of ts_send_first_enter_ns")
    assert rc == 0 and "80 requests paired" in out


# ------------------------------------------------------------------ files that are not files

def test_fifo_as_meta_json(run):
    meta = run / "ps1" / "meta.json"
    meta.unlink()
    os.mkfifo(meta)
    r = _child_report([run])
    _assert_one_line_or_named(r.returncode, r.stdout, r.stderr, f"{meta} is not a regular file (a FIFO)")


def test_fifo_as_shard(run):
    shard = run / "ps1" / "messages-000099.parquet"
    os.mkfifo(shard)
    r = _child_report([run])
    _assert_one_line_or_named(r.returncode, r.stdout, r.stderr, f"{shard} is not a regular file (a FIFO)")
    assert "80 requests paired" in r.stdout


def test_meta_json_linked_to_dev_urandom(run):
    meta = run / "ps1" / "meta.json"
    meta.unlink()
    meta.symlink_to("/dev/urandom")
    r = _child_report([run])
    _assert_one_line_or_named(r.returncode, r.stdout, r.stderr,
                              f"{meta} is not a regular file (a character device)")


def test_meta_json_too_large(run, capsys, monkeypatch):
    from agent.runmeta import MAX_META_BYTES

    meta = run / "ps1" / "meta.json"
    with open(meta, "r+b") as f:   # a sparse file: its size is what the reader must refuse
        f.truncate(MAX_META_BYTES + 1)
    rc, out, err = _report([run], capsys, monkeypatch)
    _assert_one_line_or_named(rc, out, err, f"{meta} is larger than {MAX_META_BYTES:,} bytes")


# ------------------------------------------------------------------ traced strings on a terminal

HOSTILE_HOST = "ps1[/bold][link=http://evil.example/]x\x1b[2J\x1b]8;;http://evil.example/\x07y\x9b31m\u202e"


def _rename_host(run: Path, old: str, new: str) -> None:
    _edit_meta(run, lambda m: m.__setitem__("host_id", new), host=old)
    for shard in (run / old).glob("messages-*.parquet"):
        t = pq.read_table(shard)
        pq.write_table(_set_column(t, "host_id", pa.array([new] * len(t))), shard)


@pytest.mark.parametrize("to_file", [False, True])
def test_markup_and_escapes_in_a_host_id(to_file, run, tmp_path, capsys, monkeypatch):
    from core.safetext import safe_text

    _rename_host(run, "ps1", HOSTILE_HOST)
    args = [run, "-o", tmp_path / "r.txt"] if to_file else [run]
    rc, out, err = _report(args, capsys, monkeypatch)
    text = (tmp_path / "r.txt").read_text() if to_file else out
    assert rc == 0 and "Traceback" not in err, err
    for bad in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert bad not in text and bad not in err, repr(bad)
    # shown as text, markup and all (its controls made visible)
    assert safe_text(HOSTILE_HOST) in text and "ps1[/bold][link=http://evil.example/]x" in text


def test_markup_in_an_op_and_a_problem_path(run, capsys, monkeypatch):
    """Every string of a shard is traced data: an op, a shard's file name (in a problem line)."""
    _edit_shard(run, lambda t: _set_column(t, "op", pa.array(["pull[/red]\x1b[5m"] * len(t))))
    odd = run / "w1" / "messages-[bold]\x1b]0;title\x07.parquet"
    odd.write_bytes(b"not parquet")
    rc, out, err = _report([run], capsys, monkeypatch)
    assert rc == 0 and "Traceback" not in err, err
    assert "\x1b" not in out and "\x07" not in out
    assert _flat("messages-[bold]\ufffd]0;title\ufffd.parquet: unreadable shard skipped") in _flat(out)
    assert "pull[/red]\ufffd[5m" in out


def test_agent_run_dir_reader_skips_a_fifo_shard_and_names_bad_fields(run):
    """agent.rundir.read_run_dir (tests and benches read run dirs with it) reads as the report does."""
    os.mkfifo(run / "ps1" / "messages-000099.parquet")
    _edit_meta(run, lambda m: m.__setitem__("counters", "x"))
    code = ("import sys; from agent.rundir import read_run_dir; rd = read_run_dir(sys.argv[1]); "
            "print(len(rd.tables['messages'])); print(*rd.problems, sep='\\n')")
    try:
        r = subprocess.run([sys.executable, "-c", code, str(run / "ps1")], capture_output=True, text=True,
                           cwd=ROOT, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"read_run_dir still ran after {CHILD_TIMEOUT_S} s")
    assert r.returncode == 0, r.stderr
    rows, *problems = r.stdout.splitlines()
    assert int(rows) > 0
    assert any("messages-000099.parquet is not a regular file (a FIFO)" in p for p in problems), problems
    assert any("counters is 'x', not an object: ignored" in p for p in problems), problems


@pytest.mark.parametrize("rejected, why", [
    (None, "(disk full or too slow)"),
    ({"messages": 5}, "(values no column could hold)"),
    ({"messages": 2, "notes": "x"}, "(2 with values no column could hold, the rest: disk full or too slow)"),
])
def test_dropped_rows_are_said_with_their_reason(run, rejected, why):
    """rows_dropped counts rows the writer refused (rows_rejected) and rows a failed write lost."""
    from reports.load import read_host

    def change(m):
        m["counters"]["rows_dropped"] = 5
        if rejected is not None:
            m["counters"]["rows_rejected"] = rejected
    _edit_meta(run, change)
    problems = read_host(run / "ps1").problems
    assert any(f"the agent dropped 5 rows {why}" in p for p in problems), problems
