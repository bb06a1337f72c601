"""Which libraries the agent agrees to probe (probes/libtrust.py), and what it accepts
from the confined measurement of one (probes/zmq_layout._layout_of_answer)."""
from __future__ import annotations

import dataclasses
import os

import pytest

from core.errors import UserError
from probes import libtrust, zmq_layout
from probes.zmq_layout import calibrate, pyzmq_libzmq

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def _lib(tmp_path, uid=0, mode=0o755):
    p = tmp_path / "libzmq-x.so"
    p.write_bytes(b"\x7fELF")
    p.chmod(mode)
    if uid != os.geteuid():
        os.chown(p, uid, uid)
    return p


@needs_root
def test_root_or_the_process_user_may_own_it(tmp_path):
    assert libtrust.refusal(_lib(tmp_path), os.getpid()) is None
    assert libtrust.refusal(_lib(tmp_path), None) is None


@needs_root
def test_another_users_library_is_refused(tmp_path):
    lib = _lib(tmp_path, uid=4242)
    assert "owned by uid 4242" in libtrust.refusal(lib, os.getpid())   # our process is root's
    assert "owned by uid 4242, not root" in libtrust.refusal(lib, None)
    with pytest.raises(UserError, match="not probing .* no other user could have written"):
        libtrust.check(lib, os.getpid())


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777])
def test_a_library_others_may_write_is_refused(tmp_path, mode):
    why = libtrust.refusal(_lib(tmp_path, uid=os.geteuid(), mode=mode), os.getpid())
    assert why and "writable by others" in why


def test_only_regular_files(tmp_path):
    assert libtrust.refusal(tmp_path, None) == "not a regular file"
    assert "cannot stat" in libtrust.refusal(tmp_path / "none.so", None)


@pytest.fixture(scope="module")
def answer():
    layout = calibrate(pyzmq_libzmq())
    return {k: v for k, v in dataclasses.asdict(layout).items() if k != "library"}


def test_a_sound_answer_is_taken(answer):
    assert zmq_layout._layout_of_answer(answer, "/lib/x.so").library == "/lib/x.so"


@pytest.mark.parametrize("field,value", [
    ("type_off", 64), ("type_off", -1), ("type_off", True), ("type_off", 1.0), ("type_off", "1"),
    ("content_ptr_off", 12), ("content_ptr_off", 64), ("more_mask", 3), ("vsm_type", 256),
    ("vsm_max_bytes", 0), ("version", "4.3.5; rm -rf /"), ("version", 4), ("cmsg_size_off", 2**40),
])
def test_an_answer_out_of_bounds_is_refused(answer, field, value):
    bad = dict(answer, **{field: value})
    with pytest.raises(zmq_layout._CalibrationFailed):
        zmq_layout._layout_of_answer(bad, "/lib/x.so")


def test_missing_fields_and_colliding_tags_are_refused(answer):
    with pytest.raises(zmq_layout._CalibrationFailed):
        zmq_layout._layout_of_answer({k: v for k, v in answer.items() if k != "flags_off"}, "x")
    with pytest.raises(zmq_layout._CalibrationFailed, match="same type tag"):
        zmq_layout._layout_of_answer(dict(answer, cmsg_type=answer["vsm_type"]), "x")
    with pytest.raises(zmq_layout._CalibrationFailed, match="past the end"):
        zmq_layout._layout_of_answer(dict(answer, vsm_data_off=40, vsm_max_bytes=33), "x")
