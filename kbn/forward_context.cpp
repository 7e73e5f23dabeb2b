#include "kbn/forward_context.h"

#include <algorithm>
#include <cctype>

namespace kbn {

namespace {
thread_local ForwardContext tls_ctx;
thread_local bool tls_has_ctx = false;
}  // namespace

const ForwardContext& get_forward_context() {
  KBN_CHECK(tls_has_ctx,
            "get_forward_context: no forward context is set; attention layers must run inside a "
            "model step (set one with ForwardContextGuard)");
  return tls_ctx;
}

bool has_forward_context() { return tls_has_ctx; }

const Tensor& AttentionMetadata::slot_mapping_of(int64_t g) const {
  KBN_CHECK(g >= 0 && g < num_kv_groups(), "attention metadata: KV cache group ", g, " asked for, but the step has ",
            num_kv_groups(), " group(s) of block tables");
  return g == 0 ? slot_mapping : more_slot_mappings[size_t(g - 1)];
}

const Tensor& AttentionMetadata::block_tables_of(int64_t g) const {
  KBN_CHECK(g >= 0 && g < num_kv_groups(), "attention metadata: KV cache group ", g, " asked for, but the step has ",
            num_kv_groups(), " group(s) of block tables");
  return g == 0 ? block_tables : more_block_tables[size_t(g - 1)];
}

ForwardContextGuard::ForwardContextGuard(const ForwardContext& ctx) : prev_(tls_ctx), had_prev_(tls_has_ctx) {
  tls_ctx = ctx;
  tls_has_ctx = true;
}

ForwardContextGuard::~ForwardContextGuard() {
  tls_ctx = prev_;
  tls_has_ctx = had_prev_;
}

int64_t extract_layer_index(const std::string& prefix) {
  int64_t found = -1;
  size_t i = 0;
  while (i < prefix.size()) {
    size_t j = prefix.find('.', i);
    if (j == std::string::npos) j = prefix.size();
    std::string part = prefix.substr(i, j - i);
    if (!part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(uint8_t(c)); })) {
      KBN_CHECK(found < 0, "extract_layer_index: prefix '", prefix, "' holds more than one integer");
      found = std::stoll(part);
    }
    i = j + 1;
  }
  KBN_CHECK(found >= 0, "extract_layer_index: prefix '", prefix, "' holds no layer index");
  return found;
}

}  // namespace kbn
