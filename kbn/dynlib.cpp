#include "kbn/dynlib.h"

#include <dlfcn.h>
#include <glob.h>

#include <cstdlib>

#include "kbn/error.h"

namespace kbn {

void* open_library(const std::string& what, const char* env_var, const std::vector<std::string>& paths,
                   const std::vector<std::string>& patterns, int dlopen_flags) {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv(env_var); env && *env) candidates.push_back(env);
  candidates.insert(candidates.end(), paths.begin(), paths.end());
  for (const auto& pattern : patterns) {
    glob_t g{};
    if (glob(pattern.c_str(), 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) candidates.push_back(g.gl_pathv[i]);
    globfree(&g);
  }
  std::string tried;
  for (const auto& path : candidates) {
    if (void* h = dlopen(path.c_str(), dlopen_flags)) return h;
    const char* why = dlerror();
    tried += "\n  " + path + ": " + (why ? why : "not loadable");
  }
  KBN_FAIL(what, ", which could not be loaded; set ", env_var, " to its path. Tried:", tried);
}

void* library_symbol(void* handle, const std::string& library, const char* name) {
  void* p = dlsym(handle, name);
  KBN_CHECK(p != nullptr, library, " library lacks symbol ", name);
  return p;
}

}  // namespace kbn
