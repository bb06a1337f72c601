"""zmq_msg_t layout calibration: on pyzmq's real libzmq, and refusing libraries it cannot read."""
from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from core.errors import UserError
from probes import zmq_layout
from probes.zmq_layout import MSG_T_BYTES, calibrate, pyzmq_libzmq


@pytest.fixture(scope="module")
def layout():
    return calibrate(pyzmq_libzmq())


def test_real_libzmq_calibrates_to_a_consistent_layout(layout):
    d = layout.bpf_defines()
    assert all(isinstance(v, int) for v in d.values())
    offsets = [v for k, v in d.items() if k.endswith("_OFF") and "CONTENT_D" not in k
               and "CONTENT_S" not in k]
    assert all(0 <= off < MSG_T_BYTES for off in offsets)
    assert len({layout.vsm_type, layout.lmsg_type, layout.cmsg_type}) == 3
    # inline data, its size byte and the type tag must not overlap
    inline = set(range(layout.vsm_data_off, layout.vsm_data_off + layout.vsm_max_bytes))
    assert layout.vsm_size_off not in inline and layout.type_off not in inline
    assert layout.type_off != layout.flags_off
    assert 1 <= layout.vsm_max_bytes < MSG_T_BYTES
    assert bin(layout.more_mask).count("1") == 1
    assert layout.version.count(".") == 2


def test_calibration_is_cached_per_file(layout):
    assert calibrate(pyzmq_libzmq()) is layout


def _real_samples():
    lib = zmq_layout._Lib(str(pyzmq_libzmq()))
    try:
        return [zmq_layout._init_size(lib, n) for n in (1, 20, 33, 34, 5000)] + \
            zmq_layout._exchange(lib)
    finally:
        lib.mem.close()


@pytest.mark.parametrize("field,delta", [("vsm_size_off", 1), ("vsm_data_off", 8),
                                          ("content_size_off", 8), ("type_off", -1),
                                          ("flags_off", 1), ("zclmsg_type", 50)])
def test_validation_rejects_a_wrong_offset(layout, field, delta):
    """The validation step that guards every calibration catches each kind of misread."""
    samples = _real_samples()
    zmq_layout._validate(layout, samples)  # the calibrated layout reads them all
    wrong = dataclasses.replace(layout, **{field: getattr(layout, field) + delta})
    with pytest.raises(zmq_layout._CalibrationFailed):
        zmq_layout._validate(wrong, samples)


def test_not_a_library_is_refused(tmp_path):
    tmp_path.chmod(0o755)   # the confined child (nobody) must read the directory
    bogus = tmp_path / "libzmq.so.5"
    bogus.write_bytes(b"not an ELF file\n")
    with pytest.raises(UserError, match=r"cannot calibrate .*cannot load it"):
        calibrate(bogus)


def test_a_library_without_zmq_is_refused():
    libc = next(p for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6",
                            "/lib64/libc.so.6") if Path(p).exists())
    with pytest.raises(UserError, match="does not export zmq_.*not a libzmq"):
        calibrate(libc)


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(UserError, match="cannot read libzmq"):
        calibrate(tmp_path / "libzmq.so.5")


# A library with libzmq's API but a layout calibration cannot see through:
# VARIANT 1 keeps no frame inline; VARIANT 2 stores long frames behind a
# scrambled pointer. Both keep zmq_msg_data/zmq_msg_size truthful.
_FAKE_LIBZMQ = r"""
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
typedef struct { unsigned char b[64]; } __attribute__((aligned(8))) zmq_msg_t;
typedef void (zmq_free_fn)(void *, void *);
#define KEY 0x5a5a5a5a5a5aULL
struct content { void *data; size_t size; };
static void put(zmq_msg_t *m, int off, uint64_t v) { memcpy(m->b + off, &v, 8); }
static uint64_t get(zmq_msg_t *m, int off) { uint64_t v; memcpy(&v, m->b + off, 8); return v; }
int zmq_msg_init(zmq_msg_t *m) { memset(m, 0, 64); return 0; }
int zmq_msg_init_size(zmq_msg_t *m, size_t n) {
    memset(m, 0, 64);
#if VARIANT == 2
    if (n <= 33) { m->b[41] = (unsigned char)n; m->b[42] = 101; return 0; }
#endif
    struct content *c = malloc(sizeof *c + n);
    c->data = c + 1; c->size = n;
    put(m, 8, (uint64_t)c ^ KEY); m->b[42] = 102; return 0;
}
int zmq_msg_init_data(zmq_msg_t *m, void *d, size_t n, zmq_free_fn *f, void *h) {
    memset(m, 0, 64); put(m, 8, (uint64_t)d); put(m, 16, n); m->b[42] = f ? 103 : 104; return 0;
}
void *zmq_msg_data(zmq_msg_t *m) {
    if (m->b[42] == 101) return m->b + 8;
    if (m->b[42] >= 103) return (void *)get(m, 8);
    return ((struct content *)(get(m, 8) ^ KEY))->data;
}
size_t zmq_msg_size(zmq_msg_t *m) {
    if (m->b[42] == 101) return m->b[41];
    if (m->b[42] >= 103) return get(m, 16);
    return ((struct content *)(get(m, 8) ^ KEY))->size;
}
int zmq_msg_more(zmq_msg_t *m) { return 0; }
int zmq_msg_close(zmq_msg_t *m) { return 0; }
void zmq_version(int *a, int *b, int *c) { *a = 4; *b = 3; *c = 99; }
void *zmq_ctx_new(void) { return 0; }
int zmq_ctx_term(void *c) { return 0; }
void *zmq_socket(void *c, int t) { return 0; }
int zmq_close(void *s) { return 0; }
int zmq_bind(void *s, const char *e) { return -1; }
int zmq_connect(void *s, const char *e) { return -1; }
int zmq_setsockopt(void *s, int o, const void *v, size_t n) { return -1; }
int zmq_getsockopt(void *s, int o, void *v, size_t *n) { return -1; }
int zmq_msg_send(zmq_msg_t *m, void *s, int f) { return -1; }
int zmq_msg_recv(zmq_msg_t *m, void *s, int f) { return -1; }
"""


def _build_fake(tmp_path: Path, variant: int) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler to build a fake libzmq (scripts/setup.sh installs gcc)")
    tmp_path.chmod(0o755)   # the confined child (nobody) must read the directory
    src = tmp_path / "fake.c"
    src.write_text(_FAKE_LIBZMQ)
    out = tmp_path / f"libzmq-fake{variant}.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", f"-DVARIANT={variant}", "-o", str(out),
                    str(src)], check=True, capture_output=True)
    return out


def test_a_library_storing_nothing_inline_is_refused(tmp_path):
    with pytest.raises(UserError, match="no very small message is stored inline"):
        calibrate(_build_fake(tmp_path, 1))


def test_a_library_hiding_its_content_pointer_is_refused(tmp_path):
    with pytest.raises(UserError, match="cannot locate the content block"):
        calibrate(_build_fake(tmp_path, 2))
