"""GPU tests: several MPI processes share one GPU. NCCL refuses two ranks of one communicator on one GPU of one
host, so each process gets its own NCCL_HOSTID (toolchain.md §8): NCCL then treats them as separate hosts and
carries their traffic over its socket transport. Run: cd tests && python mpi_suite.py gpu --ranks 1 2 4"""
import os

for _var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
    if _var in os.environ:
        os.environ.setdefault("NCCL_HOSTID", f"ddl-gpu-test-rank{os.environ[_var]}")
        break

import sys  # noqa: E402

for _dir in ("mpi", "train"):  # test_collectives' inputs and checks, test_torch's training comparison
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", _dir))
