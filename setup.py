"""Build the Cython twins of rmqha's hot paths.

Every ``rmqha/_core/*.pyx`` becomes an extension module of the same name.  Directives are
kept per function in the sources (bounds/wraparound only where a range was checked first),
so nothing global is set here beyond the language level.
"""
from __future__ import annotations

import glob
import os

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError as exc:  # the build requires Cython; say so plainly
    raise SystemExit("building rmqha needs Cython>=3.1 (pip install Cython)") from exc


#: Modules that link OpenSSL's libcrypto (the HA frame MAC in C): built only where its
#: headers are (Debian's libssl-dev; `make build` installs it).  Without them the HA slave
#: keeps its Python receive path (rmqha.ha.slave_lane says so once).
_LIBCRYPTO_MODULES = {"rmqha._core.slave_lane"}


def _have_libcrypto() -> bool:
    return os.path.exists("/usr/include/openssl/evp.h")


def extensions() -> list[Extension]:
    mods = []
    for path in sorted(glob.glob(os.path.join("rmqha", "_core", "*.pyx"))):
        name = path[:-4].replace(os.sep, ".")
        libraries: list[str] = []
        if name in _LIBCRYPTO_MODULES:
            if not _have_libcrypto():
                print(f"rmqha: OpenSSL headers not found (libssl-dev): {name} is not built")
                continue
            libraries = ["crypto"]
        # -O3 explicitly: the record and CRC loops rely on its vectorisation (measured ~2x
        # slower at -O2, which would otherwise override Python's default -O3 here).
        mods.append(Extension(name, [path], extra_compile_args=["-O3"], libraries=libraries))
    return cythonize(
        mods,
        compiler_directives={"language_level": "3", "embedsignature": True},
        annotate=bool(os.environ.get("RMQHA_CYTHON_ANNOTATE")),
    )


setup(ext_modules=extensions())
