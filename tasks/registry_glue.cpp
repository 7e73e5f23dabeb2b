// Binds registry(Variant) to the compiled variants. Without candidate files the candidate registry is the
// baseline's (nothing is compiled twice); with them, it is the baseline's with the entries of the ops the candidate
// variant compiled (those whose include closure reaches a candidate file) in their place.
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
    Registry own;
    candidate::register_ops(own);
    Registry r;
    for (const OpEntry& e : base.entries()) {
      const OpEntry* c = own.find(e.name);
      r.set_source(c ? c->source : e.source);
      r.add(c ? *c : e);
    }
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
