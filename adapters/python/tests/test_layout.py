"""The ctypes structs must match the C header byte for byte: compile a probe that prints the
sizes and offsets the C compiler uses and compare with ctypes."""
import ctypes
import subprocess

import pytest

from tandem import _lib, kvx
from conftest import REPO

STRUCTS = {
    "tdm_request_desc": _lib.RequestDesc,
    "tdm_batch": _lib.BatchC,
    "tdm_step_output": _lib.StepOutputC,
    "tdm_update_result": _lib.UpdateResultC,
    "tdm_request_info": _lib.RequestInfoC,
    "tdm_sched_stats": _lib.StatsC,
    "tdm_kv_layout": _lib.KVLayoutC,
    "tdm_request_view": _lib.RequestViewC,
    "tdm_policy": _lib.PolicyC,
    "tdm_kvx_recv_desc": kvx.RecvDescC,
    "tdm_kvx_send_desc": kvx.SendDescC,
    "tdm_kvx_event": kvx.EventC,
    "tdm_kvx_stats": kvx.KVXStatsC,
}


def test_structs__match_c_layout(tmp_path, cc):
    inc = REPO / "include"
    if not (inc / "tandem.h").exists():
        pytest.skip("include/tandem.h not found")
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "tandem.h"',
             'int main(void) {']
    for cname, cls in STRUCTS.items():
        lines.append(f'printf("{cname} size %zu\\n", sizeof({cname}));')
        for fname, _ in cls._fields_:
            lines.append(f'printf("{cname}.{fname} %zu\\n", offsetof({cname}, {fname}));')
    lines += ["return 0;", "}"]
    src = tmp_path / "probe.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "probe"
    subprocess.run([cc, "-I", str(inc), "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    c = dict(line.rsplit(" ", 1) for line in out.splitlines())
    for cname, cls in STRUCTS.items():
        assert int(c[f"{cname} size"]) == ctypes.sizeof(cls), cname
        for fname, _ in cls._fields_:
            assert int(c[f"{cname}.{fname}"]) == getattr(cls, fname).offset, f"{cname}.{fname}"
