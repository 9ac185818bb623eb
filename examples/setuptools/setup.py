"""The extension module; everything else is in pyproject.toml."""

from setuptools import Extension, setup

from usdtpatch.integrate.setuptools import build_ext

setup(
    ext_modules=[Extension("probedemo._probes", ["src/probedemo/_probes.c"])],
    cmdclass={"build_ext": build_ext},
)
