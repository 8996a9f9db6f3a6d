"""The `tandem` console command of the Python distribution: runs the native `tandem` executable.

The self-contained wheel (make wheel) bundles the executable next to libtandem.so.1 in
tandem/_native/ (its RPATH finds the library there and the bundled dependencies in the
wheel's tandem_serving.libs/), and pip installs this entry point as `tandem` on the PATH. The
executable is found like the library (_lib.search_paths): TANDEM_TOOL (a path; when set, only
that is tried), the bundled one, TANDEM_BUILD/tandem, the repository's build/tandem. Importing
this module imports the package, which loads libtandem first: the executable links the same
library, so where the bindings cannot load, neither could it.
"""
from __future__ import annotations

import os
import sys

from ._lib import search_paths


def _candidates(environ=None, package_dir=None):
    """(path, how) pairs in the order they are tried."""
    return search_paths("TANDEM_TOOL", "tandem", "tandem", environ, package_dir)


def find_tool(environ=None, package_dir=None) -> str:
    """The path of the native `tandem` executable; FileNotFoundError naming every path tried."""
    tried = []
    for path, how in _candidates(environ, package_dir):
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        why = "not executable" if os.path.exists(path) else "no such file"
        tried.append(f"{path} ({how}: {why})")
    raise FileNotFoundError("tandem: the native `tandem` command is not installed; tried: " +
                            "; ".join(tried) + ". Install the self-contained wheel "
                            "(pip install tandem-serving), build it with `make`, or set "
                            "TANDEM_TOOL=/path/to/tandem")


def main(argv=None) -> int:
    """Replace this process with the native command (same arguments, same exit status)."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        tool = find_tool()
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(tool, ["tandem", *args])
    except OSError as e:
        print(f"tandem: cannot run {tool}: {e}", file=sys.stderr)
        return 126
    return 0  # not reached: execv does not return on success


if __name__ == "__main__":
    sys.exit(main())
