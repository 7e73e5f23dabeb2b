// The op registry's refusals (kbn/registry.h): a second op of the same name names both facts files, a declared
// mutated argument that the op does not take is named, and every registered op of the baseline came from a facts
// file under tasks/ops/ (none from a central list).
#include <gtest/gtest.h>

#include "kbn/error.h"
#include "kbn/registry.h"

using namespace kbn;

namespace {

OpEntry entry(const std::string& name) {
  OpEntry e;
  e.name = name;
  e.class_name = "X";
  e.header = "L1/x.h";
  e.args = {"x"};
  e.make = [](const OpArgs&) -> std::unique_ptr<AnyOp> { return nullptr; };
  return e;
}

std::string error_of(Registry& r, OpEntry e) {
  try {
    r.add(std::move(e));
  } catch (const Error& err) {
    return err.what();
  }
  return "";
}

}  // namespace

TEST(Registry, DuplicateNameNamesBothFactsFiles) {
  Registry r;
  r.set_source("tasks/ops/L1/a.cpp");
  r.add(entry("my_op"));
  r.set_source("tasks/ops/L1/b.cpp");
  const std::string m = error_of(r, entry("my_op"));
  EXPECT_NE(m.find("'my_op' is registered twice"), std::string::npos) << m;
  EXPECT_NE(m.find("tasks/ops/L1/a.cpp"), std::string::npos) << m;
  EXPECT_NE(m.find("tasks/ops/L1/b.cpp"), std::string::npos) << m;
}

TEST(Registry, MutatedArgumentMustBeAnArgument) {
  Registry r;
  r.set_source("tasks/ops/L1/c.cpp");
  OpEntry e = entry("writes_y");
  e.mutates = {"y"};
  const std::string m = error_of(r, e);
  EXPECT_NE(m.find("tasks/ops/L1/c.cpp"), std::string::npos) << m;
  EXPECT_NE(m.find("mutates 'y'"), std::string::npos) << m;
  OpEntry l2 = entry("model_in_l2");
  l2.level = 2;
  l2.architectures = {"XForCausalLM"};
  EXPECT_NE(error_of(r, l2).find("not an L4 model"), std::string::npos);
}

TEST(Registry, EveryBaselineOpComesFromItsFactsFile) {
  for (const auto& e : registry(Variant::baseline).entries()) {
    EXPECT_EQ(e.source.rfind("tasks/ops/L" + std::to_string(e.level) + "/", 0), 0u) << e.name << ": " << e.source;
    EXPECT_EQ(e.header.rfind("L" + std::to_string(e.level) + "/", 0), 0u) << e.name << ": " << e.header;
  }
}
