#!/bin/sh
# Builds a real Horovod 0.28.1 (CPU, gloo) in a venv of its own, as a peer to compare ddl's Horovod surface
# and benchmarks with:  sh benchmarks/build_horovod.sh torch|tensorflow VENV   (about 10 minutes on 2 cores)
#
#   torch:      HOROVOD_PYTHON=VENV/bin/python for tests/examples' real-Horovod comparisons, and
#               python benchmarks/horovod_synthetic.py --horovod-python VENV/bin/python
#   tensorflow: builds, but on Keras 3 (TF >= 2.16) Horovod's tf.keras does not work: its callbacks fail
#               (keras.backend.get_value, Variable.ref) and its DistributedOptimizer averages nothing (it
#               reduces in _aggregate_gradients, which Keras 3's apply_gradients never calls): ranks diverge.
#
# Horovod's last release needs two patches to build today: C++17 (PyTorch >= 2.1's headers need it; Horovod
# asks for C++14) and CMAKE_POLICY_VERSION_MINIMUM (its bundled gloo predates CMake 4); with TensorFlow, its
# XLA ops are left out (GPU-only, and TF 2.21's wheel lacks the headers they include).
set -eu
framework=${1:?torch or tensorflow}
venv=${2:?where the venv goes}
case "$framework" in
  torch) with="HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1"; packages="torch==2.13.0" ;;
  tensorflow) with="HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1"; packages="tensorflow-cpu" ;;
  *) echo "build_horovod.sh: torch or tensorflow, not '$framework'" >&2; exit 2 ;;
esac
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip wheel setuptools cmake
"$venv/bin/pip" install -q $packages numpy
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
"$venv/bin/pip" download -q --no-deps --no-binary :all: horovod==0.28.1 -d "$src"
tar xzf "$src/horovod-0.28.1.tar.gz" -C "$src"
cd "$src/horovod-0.28.1"
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' CMakeLists.txt horovod/torch/CMakeLists.txt \
  horovod/tensorflow/CMakeLists.txt
sed -i 's|^list(APPEND TF_SOURCES "${PROJECT_SOURCE_DIR}/horovod/tensorflow/xla_mpi_ops.cc")||' \
  horovod/tensorflow/CMakeLists.txt
env CMAKE_POLICY_VERSION_MINIMUM=3.5 $with HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
  HOROVOD_CPU_OPERATIONS=GLOO MAKEFLAGS=-j"$(nproc)" "$venv/bin/pip" install -q --no-build-isolation .
cd /
"$venv/bin/horovodrun" --check-build
