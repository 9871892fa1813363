// Status checks for MPI calls (communicators run with MPI_ERRORS_RETURN, so every call reports instead of
// aborting). A failure throws megatron::Error naming the call as written, MPI's error class and text, and
// what the caller adds (group, rank, sizes). Include only from .cpp files: it brings in <mpi.h>.
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <source_location>
#include <string>

#include "megatron/core/error.h"

namespace megatron::comm::detail {
[[noreturn]] void fail_mpi(const char* call, int status, const std::string& extra, std::source_location where);
}  // namespace megatron::comm::detail

#define MPI_CHECK_MSG(call, ...)                                                                         \
  do {                                                                                                   \
    int mpi_status_ = (call);                                                                            \
    if (mpi_status_ != MPI_SUCCESS) [[unlikely]]                                                         \
      ::megatron::comm::detail::fail_mpi(#call, mpi_status_, ::megatron::str_cat(__VA_ARGS__),           \
                                         std::source_location::current());                               \
  } while (0)
#define MPI_CHECK(call) MPI_CHECK_MSG(call, "")
