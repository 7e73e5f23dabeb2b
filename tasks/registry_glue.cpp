// Binds registry(Variant) to the compiled variants. Without candidate files the candidate registry is the
// baseline's (nothing is compiled twice).
#include "kbn/registry.h"

namespace kbn {
namespace baseline {
void register_ops(Registry& r);
}
#ifdef KBN_HAVE_CANDIDATE
namespace candidate {
void register_ops(Registry& r);
}
#endif

const Registry& registry(Variant v) {
  static const Registry base = [] {
    Registry r;
    baseline::register_ops(r);
    return r;
  }();
#ifdef KBN_HAVE_CANDIDATE
  static const Registry cand = [] {
    Registry r;
    candidate::register_ops(r);
    return r;
  }();
  return v == Variant::baseline ? base : cand;
#else
  (void)v;
  return base;
#endif
}

bool candidate_built() {
#ifdef KBN_HAVE_CANDIDATE
  return true;
#else
  return false;
#endif
}

}  // namespace kbn
