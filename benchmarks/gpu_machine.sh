#!/bin/bash
# The GPU checks on the lent machine (../shared/reference/gpu-machine.md), one call: builds ddl in /tmp/v from
# the carried wheels (.whl: Open MPI, mpi4py, setuptools, jsonschema's set, pytest-mpi), starts CUDA MPS, then
# runs the named steps, each one's log and table under $OUT. Steps:
#   tests        tests/gpu at 1, 2 and 4 ranks, side by side
#   allreduce N  benchmarks/device_allreduce.py at N ranks (NCCL alone beside)
#   training N   benchmarks/device_training.py at N ranks (DDP and FSDP2 on CUDA: ddl against nccl)
#   cluster      benchmarks/device_cluster.py on the emulated T1 and T2 (8 ranks on the one GPU through MPS; ddl with
#                NCCL at every level, staged, auto, and NCCL alone). Needs iproute2 there: run
#                benchmarks/carry_iproute.sh here first and carry .iproute as well
# e.g. (device tool, carry .whl): bash benchmarks/gpu_machine.sh tests allreduce 2 training 2
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SECONDS=0
python3 -m venv /tmp/v
echo "$(python3 -c 'import site; print(site.getsitepackages()[0])')" > /tmp/v/lib/python3.12/site-packages/image.pth
/tmp/v/bin/python -m pip install -q --no-index --no-deps --ignore-installed .whl/*.whl > "$OUT/build.log" 2>&1
DDL_BUILD_JOBS=16 /tmp/v/bin/python -m pip install -q --no-build-isolation --no-deps -e . >> "$OUT/build.log" 2>&1 \
    || { tail -40 "$OUT/build.log"; exit 1; }
rm "$OUT/build.log"; echo "built in ${SECONDS} s"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
export PATH=/tmp/v/bin:$PATH PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
export OMPI_MCA_hwloc_base_binding_policy=none
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog DDL_BENCH_MPS=1
mkdir -p /tmp/mps /tmp/mpslog && nvidia-cuda-mps-control -d || export DDL_BENCH_MPS=0
trap 'echo quit | nvidia-cuda-mps-control 2>/dev/null' EXIT
while [ $# -gt 0 ]; do
    step=$1; shift
    case $step in
    tests)
        for n in 1 2 4; do
            (cd tests && timeout 280 python mpi_suite.py gpu --ranks $n --timeout 240 > "$OUT/tests-gpu-$n.log" 2>&1) &
        done
        wait
        for n in 1 2 4; do
            echo "tests/gpu at $n: $(tail -1 "$OUT/tests-gpu-$n.log")"
            cat "$OUT/tests-gpu-$n.log" >> "$OUT/tests-gpu.log" && rm "$OUT/tests-gpu-$n.log"  # (8 files come back)
        done ;;
    allreduce|training)
        n=$1; shift
        script=benchmarks/device_$step.py
        [ -f "$script" ] || { echo "no $script"; continue; }
        timeout 300 python "$script" --np "$n" --out "$OUT/device-$step-$n.md" > "$OUT/device-$step-$n.log" 2>&1 \
            && cat "$OUT/device-$step-$n.md" || { echo "$script --np $n failed:"; tail -30 "$OUT/device-$step-$n.log"; } ;;
    cluster)
        [ -x .iproute/wrap/ip ] || { echo "no .iproute: run benchmarks/carry_iproute.sh here and carry it"; continue; }
        PATH=$PWD/.iproute/wrap:$PATH timeout 500 python benchmarks/device_cluster.py --topologies T1,T2 \
            --sizes 1M,32M --out "$OUT/device-cluster.md" > "$OUT/device-cluster.log" 2>&1 \
            && cat "$OUT/device-cluster.md" || { echo "device_cluster.py failed:"; tail -30 "$OUT/device-cluster.log"; } ;;
    *) echo "unknown step $step"; exit 2 ;;
    esac
    echo "[$step done at ${SECONDS} s]"
done
