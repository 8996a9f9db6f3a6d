"""Where the bindings look for libtandem and the `tandem` command (tandem._lib, tandem._cli):
an explicit TANDEM_LIBRARY / TANDEM_TOOL wins, then what the self-contained wheel bundles in
tandem/_native/, then the build directories. The wheel itself is checked by make wheel-check
(mk/wheel.mk)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import tandem
from tandem import _cli, _lib


def _order(environ, package_dir):
    return [how for _, how in _lib._candidates(environ, package_dir)]


def test_candidates__explicit_library_is_the_only_one_tried(tmp_path):
    got = list(_lib._candidates({"TANDEM_LIBRARY": "/x/libtandem.so", "TANDEM_BUILD": "/b"},
                                tmp_path / "tandem"))
    assert got == [("/x/libtandem.so", "TANDEM_LIBRARY")]


def test_candidates__bundled_library_comes_before_build_directories(tmp_path):
    pkg = tmp_path / "a" / "b" / "tandem"
    got = list(_lib._candidates({"TANDEM_BUILD": "/b"}, pkg))
    assert got[0] == (str(pkg / "_native" / "libtandem.so.1"), "bundled")
    assert got[1] == (str(Path("/b") / "libtandem.so"), "TANDEM_BUILD")
    assert got[2] == (str(tmp_path / "build" / "libtandem.so"), "repository build/")
    assert _order({"TANDEM_BUILD": "/b"}, pkg)[3] == "system loader"


def test_candidates__empty_override_is_ignored(tmp_path):
    assert _order({"TANDEM_LIBRARY": ""}, tmp_path / "x" / "tandem")[0] == "bundled"


def test_import__bundled_library_is_loaded_without_any_variable(tmp_path):
    """A copy of the package with the library in _native/ loads it with no TANDEM_* set."""
    pkg = tmp_path / "site" / "tandem"
    shutil.copytree(Path(tandem.__file__).parent, pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "_native"))
    (pkg / "_native").mkdir()
    real = os.path.realpath(tandem.library_path)
    shutil.copy(real, pkg / "_native" / "libtandem.so.1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    env["PYTHONPATH"] = str(pkg.parent)
    r = subprocess.run([sys.executable, "-c", "import tandem; print(tandem.library_path)"],
                       env=env, capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(pkg / "_native" / "libtandem.so.1")


def test_import__broken_bundled_library_falls_through_and_is_named(tmp_path):
    pkg = tmp_path / "site" / "tandem"
    shutil.copytree(Path(tandem.__file__).parent, pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "_native"))
    (pkg / "_native").mkdir()
    (pkg / "_native" / "libtandem.so.1").write_bytes(b"not an ELF file")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
    env["PYTHONPATH"] = str(pkg.parent)
    env["TANDEM_BUILD"] = str(tmp_path / "nobuild")
    r = subprocess.run([sys.executable, "-c", "import tandem"], env=env, capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode != 0
    assert "cannot load libtandem.so" in r.stderr
    assert str(pkg / "_native" / "libtandem.so.1") + " (bundled:" in r.stderr
    assert "pip install tandem-serving" in r.stderr


def test_cli__explicit_tool_is_the_only_one_tried(tmp_path):
    got = list(_cli._candidates({"TANDEM_TOOL": "/t/tandem"}, tmp_path / "tandem"))
    assert got == [("/t/tandem", "TANDEM_TOOL")]


def test_cli__bundled_tool_before_build_directories(tmp_path):
    pkg = tmp_path / "a" / "b" / "tandem"
    got = list(_cli._candidates({"TANDEM_BUILD": "/b"}, pkg))
    assert got == [(str(pkg / "_native" / "tandem"), "bundled"),
                   (str(Path("/b") / "tandem"), "TANDEM_BUILD"),
                   (str(tmp_path / "build" / "tandem"), "repository build/")]


def test_cli__missing_tool_names_every_path_and_exits_127(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TANDEM_TOOL", str(tmp_path / "nope"))
    assert _cli.main(["--help"]) == 127
    err = capsys.readouterr().err
    assert str(tmp_path / "nope") + " (TANDEM_TOOL: no such file)" in err
    assert "pip install tandem-serving" in err


def test_cli__runs_the_tool_with_its_arguments_and_exit_status(tmp_path):
    tool = tmp_path / "fake-tandem"
    tool.write_text("#!/bin/sh\necho \"ARGS $0 $*\"\nexit 3\n")
    tool.chmod(0o755)
    env = dict(os.environ, TANDEM_TOOL=str(tool))
    r = subprocess.run([sys.executable, "-m", "tandem._cli", "sim", "--x", "1"], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 3, r.stderr
    assert r.stdout.strip().endswith("sim --x 1")


def test_cli__not_executable_is_refused(tmp_path):
    tool = tmp_path / "tandem-noexec"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o644)
    try:
        _cli.find_tool({"TANDEM_TOOL": str(tool)})
    except FileNotFoundError as e:
        assert "not executable" in str(e)
    else:
        raise AssertionError("a non-executable TANDEM_TOOL was accepted")
