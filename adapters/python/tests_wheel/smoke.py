"""Checks an installed self-contained wheel (tandem-serving) the way a new user meets it: run
by `make wheel-check` (part of `make test`: a clean virtualenv on the build machine) and by
`make test-wheel` (a fresh Debian chroot with only python3 and python3-venv). Run it with the
virtualenv's python, from outside the repository, with no TANDEM_* variable set.

    python smoke.py [--trace FILE.csv] [--expect-no-system-libs] [--import-name-only]

Each check prints "PASS name" or "FAIL name: why"; the exit status is the number of failures.
--trace also runs `tandem sim` on a CSV trace (header + one row per request) and checks that
every request completed; --expect-no-system-libs (the chroot) also checks that no libzmq,
libsodium, jansson or msgpack-c exists outside the wheel and that there is no compiler;
--import-name-only checks only that no other installed distribution has files under tandem/
(the chroot runs it after installing vLLM).
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

FAILED = []
BUNDLED = ("libzmq", "libsodium", "libjansson", "libmsgpackc", "libxxhash", "libcrypto")


def check(name, fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 -- every failure is reported, none stops the rest
        FAILED.append(name)
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
    else:
        print(f"PASS {name}", flush=True)


def no_tandem_variables():
    found = sorted(k for k in os.environ if k.startswith("TANDEM_"))
    assert not found, f"set: {found}"


def imports_bundled_library():
    import tandem
    native = os.path.join(os.path.dirname(os.path.abspath(tandem.__file__)), "_native")
    assert tandem.library_path == os.path.join(native, "libtandem.so.1"), tandem.library_path
    assert tandem.has_scheduler() and tandem.has_kvx()
    print(f"     tandem {tandem.__version__}, library {tandem.library_version} "
          f"from {tandem.library_path}")


def dependencies_come_from_the_wheel():
    """Every one of the library's non-system dependencies is mapped from the wheel's .libs."""
    import tandem  # noqa: F401 -- loads the library
    maps = open("/proc/self/maps").read()
    libs = sorted(set(re.findall(r"(/\S+\.so[.\d]*)\s*$", maps, re.M)))
    ours = [p for p in libs if "/tandem_serving.libs/" in p]
    for name in ("libzmq", "libsodium", "libjansson", "libcrypto", "libxxhash"):
        assert any(os.path.basename(p).startswith(name + "-") for p in ours), \
            f"{name} is not loaded from tandem_serving.libs: {ours}"
    outside = [p for p in libs if "/tandem_serving.libs/" not in p and
               os.path.basename(p).startswith(BUNDLED)]
    assert not outside, f"loaded from outside the wheel: {outside}"


def schedules_with_prefix_cache():
    """Three requests sharing a 32-token prefix run to their lengths; the later two start from
    the first one's cached blocks (their first batch entry begins at token 32)."""
    import tandem
    prefix = list(range(100, 132))
    outs, reasons, first = {}, {}, {}
    with tandem.Scheduler(block_size=16, num_blocks=256, max_num_batched_tokens=256,
                          max_num_seqs=8, enable_prefix_caching=True) as s:
        now = 0.0

        def run(steps):
            nonlocal now
            for _ in range(steps):
                if s.num_unfinished() == 0:
                    return
                now += 0.01
                b = s.step(now=now)
                for e in b:
                    first.setdefault(e.req_id, e.num_computed)
                for u in s.update({e.req_id: [7] for e in b}, now=now):
                    outs[u.req_id] = outs.get(u.req_id, 0) + u.num_new_tokens
                    if u.finish_reason != tandem.FinishReason.NONE:
                        reasons[u.req_id] = u.finish_reason

        s.add(tandem.Request(id=1, prompt=prefix + [1, 2, 3], max_tokens=4))
        run(2)  # the first request's prompt is computed (and its full blocks cached) first
        s.add(tandem.Request(id=2, prompt=prefix + [4, 5], max_tokens=4))
        s.add(tandem.Request(id=3, prompt=prefix + [6], max_tokens=4))
        run(50)
        assert s.num_unfinished() == 0, "requests did not finish in 50 steps"
    assert outs == {1: 4, 2: 4, 3: 4}, outs
    assert reasons == {i: tandem.FinishReason.LENGTH for i in (1, 2, 3)}, reasons
    assert (first[2], first[3]) == (32, 32), f"first computed tokens of 2 and 3: {first}"


def tool():
    path = shutil.which("tandem")
    assert path, "no `tandem` on PATH"
    return path


def command_runs():
    r = subprocess.run([tool(), "demo"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"tandem demo: exit {r.returncode}: {r.stderr[-500:]}"
    assert r.stdout.strip(), "tandem demo printed nothing"


def cuda_absent_is_a_clear_error():
    """Without a usable GPU `tandem profile` stops with a message naming CUDA or
    libtandem_cuda.so and the reason (no device, libcudart missing), not a crash."""
    r = subprocess.run([tool(), "profile", "--model", "llama-3-8b"], capture_output=True,
                       text=True, timeout=120)
    if r.returncode == 0:
        print("     (a GPU is usable here: tandem profile ran)")
        return
    assert 0 < r.returncode < 128, f"exit {r.returncode}: {r.stderr[-500:]}"
    assert "cuda" in r.stderr.lower(), r.stderr[-500:]
    print(f"     {r.stderr.strip().splitlines()[-1]}")


def sim_on_trace(trace):
    with open(trace) as f:
        rows = sum(1 for line in f if line.strip()) - 1
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "sim.json")
        r = subprocess.run([tool(), "sim", "--trace", trace, "--model", "llama-3-8b",
                            "--hw", "h100-sxm", "--json", out], capture_output=True, text=True,
                           timeout=600)
        assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-500:]}"
        res = json.load(open(out))
    assert res["requests"] == rows and res["completed"] == rows, \
        f"{res['completed']} of {res['requests']} completed, the trace has {rows} rows"
    print(f"     {res['completed']} of {rows} requests completed, "
          f"{res['steps']} steps, {res['request_throughput']:.3f} req/s")


def no_system_copies():
    """The chroot has no libzmq, libsodium, jansson or msgpack-c and no compiler (a Debian
    minbase with python3 does have libcrypto, which python3 needs, and libxxhash, which apt
    needs: for those, dependencies_come_from_the_wheel checks that the wheel's are loaded)."""
    absent = ("libzmq", "libsodium", "libjansson", "libmsgpackc")
    pats = [f"{d}/**/{n}*.so*" for d in ("/usr/lib", "/lib", "/usr/local/lib") for n in absent]
    found = sorted({p for pat in pats for p in glob.glob(pat, recursive=True)})
    assert not found, f"present outside the wheel: {found}"
    for cc in ("cc", "gcc", "clang", "c++"):
        assert shutil.which(cc) is None, f"a compiler is installed: {shutil.which(cc)}"


def import_name_is_ours():
    """No installed distribution but tandem-serving has files under tandem/ (after vLLM and
    its dependencies are installed too: the import name `tandem` collides with none)."""
    import importlib.metadata as md
    owners = sorted({d.metadata["Name"] for d in md.distributions()
                     for f in (d.files or ()) if f.parts and f.parts[0] == "tandem"})
    assert owners == ["tandem-serving"], f"distributions with files under tandem/: {owners}"
    print(f"     {len(list(md.distributions()))} distributions installed, tandem/ is "
          f"tandem-serving's alone")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace")
    ap.add_argument("--expect-no-system-libs", action="store_true")
    ap.add_argument("--import-name-only", action="store_true",
                    help="only check that no other distribution installs tandem/")
    a = ap.parse_args()
    if a.import_name_only:
        check("import_name_is_ours", import_name_is_ours)
        return len(FAILED)
    check("no_tandem_variables", no_tandem_variables)
    if a.expect_no_system_libs:
        check("no_system_copies_of_the_dependencies", no_system_copies)
    check("imports_bundled_library", imports_bundled_library)
    check("import_name_is_ours", import_name_is_ours)
    check("dependencies_come_from_the_wheel", dependencies_come_from_the_wheel)
    check("schedules_with_prefix_cache", schedules_with_prefix_cache)
    check("tandem_command_runs", command_runs)
    check("cuda_absent_is_a_clear_error", cuda_absent_is_a_clear_error)
    if a.trace:
        check("tandem_sim_on_trace", lambda: sim_on_trace(a.trace))
    return len(FAILED)


if __name__ == "__main__":
    sys.exit(main())
