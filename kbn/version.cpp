#include "kbn/version.h"

#include "kbn_commit.h"  // generated at every build by cmake/git_commit.cmake

namespace kbn {
const BuildInfo& build_info() {
  static const BuildInfo info{KBN_GIT_COMMIT, KBN_BUILD_TYPE, KBN_CUDA_VERSION, KBN_CUDA_FLAGS,
#ifdef KBN_WITH_CUDA
                              true
#else
                              false
#endif
  };
  return info;
}
}  // namespace kbn
