# Sourced by the two-GPU benchmark scripts (scripts/gpu/*_bench.sh), from the repository root: the log folder
# $OUT (default ./gpu-out), the environment every two-rank run needs, and MPI, the launcher line.
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0   # never use NVLink multicast on shared machines
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI=(mpirun -np 2 -x NCCL_NVLS_ENABLE -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM --bind-to none)
