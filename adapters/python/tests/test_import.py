"""Import-time behaviour: version, ABI check, library search."""
import os
import subprocess
import sys
import textwrap

import pytest

import tandem


def _import_with(env_extra, tmp_path):
    env = dict(os.environ)
    env.update(env_extra)
    code = "import tandem; print('LOADED', tandem.library_path)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=tmp_path)


def test_version__is_package_version():
    assert tandem.__version__ == "0.2.0"
    assert tandem.library_version.count(".") == 2


def test_abi_version__matches_bindings():
    assert tandem.ABI_VERSION == 1
    assert tandem._lib.lib.tdm_abi_version() == tandem.ABI_VERSION


def test_import__abi_mismatch_raises_clear_import_error(tmp_path, cc):
    src = tmp_path / "fake.c"
    src.write_text(textwrap.dedent("""
        unsigned tdm_abi_version(void) { return 99; }
        unsigned tdm_version_number(void) { return 9900; }
        const char *tdm_version_string(void) { return "99.0.0"; }
        const char *tdm_strerror(int s) { (void)s; return "x"; }
    """))
    so = tmp_path / "libfake.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    r = _import_with({"TANDEM_LIBRARY": str(so)}, tmp_path)
    assert r.returncode != 0
    assert "ImportError" in r.stderr
    assert "ABI version 99" in r.stderr and "need 1" in r.stderr


def test_import__missing_library_names_what_was_tried(tmp_path):
    r = _import_with({"TANDEM_LIBRARY": str(tmp_path / "nope.so")}, tmp_path)
    assert r.returncode != 0
    assert "cannot load libtandem.so" in r.stderr
    assert "nope.so" in r.stderr and "TANDEM_LIBRARY" in r.stderr


def test_strerror__names_codes():
    assert tandem.strerror(0) == "ok"
    assert tandem.strerror(-3) == "not found"
    assert tandem.strerror(-999) == "unknown error"


def test_tandem_error__carries_status_and_message():
    e = tandem.TandemError(tandem.Status.NOT_FOUND, "request 7 is unknown", "tdm_sched_abort")
    assert e.status == -3 and e.code is tandem.Status.NOT_FOUND
    assert e.message == "request 7 is unknown"
    assert "tdm_sched_abort" in str(e) and "request 7 is unknown" in str(e)


def test_import__library_without_scheduler_imports_and_reports_unsupported(tmp_path, cc):
    src = tmp_path / "partial.c"
    src.write_text(textwrap.dedent("""
        unsigned tdm_abi_version(void) { return 1; }
        unsigned tdm_version_number(void) { return 100; }
        const char *tdm_version_string(void) { return "0.1.0"; }
        const char *tdm_strerror(int s) { return s == -20 ? "not supported" : "x"; }
    """))
    so = tmp_path / "libpartial.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    code = ("import tandem\n"
            "assert not tandem.has_scheduler() and not tandem.has_kvx()\n"
            "try:\n"
            "    tandem.Scheduler()\n"
            "except tandem.TandemError as e:\n"
            "    print('STATUS', e.status, 'tdm_sched_create' in e.message)\n")
    env = dict(os.environ, TANDEM_LIBRARY=str(so))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "STATUS -20 True" in r.stdout
