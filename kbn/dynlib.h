#pragma once
// Opening a shared library at run time (dlopen), for the optional dependencies a binary must start without:
// NCCL for tensor parallelism (kbn/comm.cpp), CUPTI for kernel tracing (engine/kernel_trace.cpp).
#include <string>
#include <vector>

namespace kbn {

// The first library that opens, trying in order: $env_var when set, each of `paths` (names the loader resolves,
// or absolute paths), then every file matching each glob of `patterns`. Fails with "<what>, which could not be
// loaded; set <env_var> to its path. Tried:" and every place tried with the loader's reason.
void* open_library(const std::string& what, const char* env_var, const std::vector<std::string>& paths,
                   const std::vector<std::string>& patterns, int dlopen_flags);

// The symbol `name` of a library open_library() opened; fails naming `library` and the symbol when it lacks it.
void* library_symbol(void* handle, const std::string& library, const char* name);

}  // namespace kbn
