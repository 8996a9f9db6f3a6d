"""Build hook of the `tandem-serving` distribution (the metadata lives in pyproject.toml).

A plain `pip install ./adapters/python` builds a pure-Python wheel (ctypes bindings that find
libtandem.so elsewhere). `make wheel` first copies the native files into tandem/_native/
(libtandem.so.1, the `tandem` executable, libtandem_cuda.so when built); the wheel is then
platform-specific, and this hook tags it so: py3-none-linux_<arch> (any Python 3, no Python
ABI: nothing here is a CPython extension), Root-Is-Purelib false. auditwheel repair then
bundles the dependencies and turns the linux tag into a manylinux one.
"""
from pathlib import Path

from setuptools import setup

kw = {}
if (Path(__file__).resolve().parent / "tandem" / "_native" / "libtandem.so.1").is_file():
    from setuptools.command.bdist_wheel import bdist_wheel
    from setuptools.dist import Distribution

    class NativeDistribution(Distribution):
        """Native files inside: installed into platlib, and the wheel is not pure."""

        def has_ext_modules(self):
            return True

    class bdist_wheel_native(bdist_wheel):
        def get_tag(self):
            return "py3", "none", super().get_tag()[2]

    kw = {"distclass": NativeDistribution, "cmdclass": {"bdist_wheel": bdist_wheel_native}}

setup(**kw)
