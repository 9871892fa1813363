# Sourced by the multi-GPU benchmark scripts (scripts/gpu/*_bench.sh), from the repository root: the log folder
# $OUT (default ./gpu-out), the environment every multi-rank run needs, MPI (the launcher line, GPUS ranks:
# default 2; node_bench.sh sets 8) and last_timer_report.
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0   # never use NVLink multicast on shared machines
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI=(mpirun -np "${GPUS:-2}" -x NCCL_NVLS_ENABLE -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM --bind-to none)

# The last --timing-log-level report of a run's log, the timers matching <regex>, names without their dots.
last_timer_report() {  # last_timer_report <log> <regex>
  tac "$1" | awk '/time across ranks \(ms\):/ {exit} {print}' | tac | grep -E "$2" | sed 's/\.\.\.*//'
}
