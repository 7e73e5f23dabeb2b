#pragma once
// Provenance of this build, stamped into every result.
#include <string>

namespace kbn {
struct BuildInfo {
  std::string git_commit;  // short hash, "+dirty" when tracked files had changes at build time
  std::string build_type;
  std::string cuda_version;  // toolkit used to build, empty without CUDA
  std::string cuda_flags;
  bool with_cuda = false;
};
const BuildInfo& build_info();
}  // namespace kbn
