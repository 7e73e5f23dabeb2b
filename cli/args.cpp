#include "cli/args.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <regex>

#include "kbn/error.h"

namespace kbn::cli {
namespace {

namespace fs = std::filesystem;

// The whole string as a signed integer.
bool parse_integer(const std::string& s, int64_t& out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  out = v;
  return true;
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

// The subcommand named by argv[1], or null.
CLI::App* named_subcommand(CLI::App& app, int argc, const char* const* argv) {
  if (argc < 2) return nullptr;
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    if (sub->get_name() == argv[1]) return sub;
  return nullptr;
}

// Subcommands shown in --help (hidden ones, such as the kernels worker, have an empty group).
std::vector<std::string> visible_subcommands(CLI::App& app) {
  std::vector<std::string> out;
  for (CLI::App* sub : app.get_subcommands([](CLI::App* a) { return !a->get_group().empty(); }))
    out.push_back(sub->get_name());
  return out;
}

// Every "--long" and "-s" spelling the command accepts; `visible` only those shown in its --help.
std::vector<std::string> flag_names(CLI::App& cmd, bool visible) {
  std::vector<std::string> out;
  for (const CLI::Option* opt : cmd.get_options()) {
    if (visible && opt->get_group().empty()) continue;
    for (const auto& l : opt->get_lnames()) out.push_back("--" + l);
    for (const auto& s : opt->get_snames()) out.push_back("-" + s);
  }
  return out;
}

bool looks_like_number(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

}  // namespace

CLI::Validator integer_at_least(int64_t min, const std::string& what) {
  return CLI::Validator(
      [min, what](std::string& s) -> std::string {
        int64_t v = 0;
        if (parse_integer(s, v) && v >= min) return "";
        return "expected " + what + " >= " + std::to_string(min) + ", got '" + s + "'";
      },
      "INT>=" + std::to_string(min));
}

CLI::Validator integer_in(int64_t lo, int64_t hi, const std::string& meaning) {
  return CLI::Validator(
      [lo, hi, meaning](std::string& s) -> std::string {
        int64_t v = 0;
        if (parse_integer(s, v) && v >= lo && v <= hi) return "";
        return "expected " + (meaning.empty() ? std::to_string(lo) + ".." + std::to_string(hi) : meaning) +
               ", got '" + s + "'";
      },
      std::to_string(lo) + ".." + std::to_string(hi));
}

CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        const bool digits = !s.empty() && s.size() <= 20 && std::all_of(s.begin(), s.end(), ::isdigit);
        errno = 0;
        if (digits) std::strtoull(s.c_str(), nullptr, 10);
        if (digits && errno == 0) return "";
        return "expected a seed 0..18446744073709551615, got '" + s + "'";
      },
      "SEED");
}

CLI::Validator positive_number(bool zero_ok) {
  return CLI::Validator(
      [zero_ok](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = s.empty() ? 0 : std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size() && (v > 0 || (zero_ok && v == 0))) return "";
        return std::string("expected a number ") + (zero_ok ? ">= 0" : "> 0") + ", got '" + s + "'";
      },
      zero_ok ? "NUMBER>=0" : "NUMBER>0");
}

CLI::Validator fraction_below_one() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = s.empty() ? -1 : std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size() && v >= 0 && v < 1) return "";
        return "expected a fraction in [0, 1), got '" + s + "'";
      },
      "0<=NUMBER<1");
}

CLI::Validator fraction_up_to_one() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = s.empty() ? -1 : std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size() && v > 0 && v <= 1) return "";
        return "expected a fraction in (0, 1], got '" + s + "'";
      },
      "0<NUMBER<=1");
}

CLI::Validator one_of(const std::vector<std::string>& choices) {
  return CLI::Validator(
      [choices](std::string& s) -> std::string {
        if (std::find(choices.begin(), choices.end(), s) != choices.end()) return "";
        const std::string near = closest(s, choices);
        std::string list;
        for (size_t i = 0; i < choices.size(); ++i)
          list += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
        return "expected " + list + ", got '" + s + "'" +
               (near.empty() ? "" : "; did you mean '" + near + "'?");
      },
      join(choices, "|"));
}

void check_output_file(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  const fs::path p(path);
  KBN_CHECK(!fs::is_directory(p), flag, ": '", path, "' is a folder; give the path of a file to write");
  const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
  KBN_CHECK(fs::exists(parent), flag, ": cannot write '", path, "': the folder '", parent.string(),
            "' does not exist");
  KBN_CHECK(fs::is_directory(parent), flag, ": cannot write '", path, "': '", parent.string(), "' is not a folder");
  KBN_CHECK(::access(parent.c_str(), W_OK | X_OK) == 0, flag, ": cannot write '", path, "': the folder '",
            parent.string(), "' is not writable");
  KBN_CHECK(!fs::exists(p) || ::access(p.c_str(), W_OK) == 0, flag, ": cannot write '", path,
            "': the file exists and is not writable");
}

void check_output_dir(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  fs::path p = fs::absolute(path);
  if (fs::exists(p)) {
    KBN_CHECK(fs::is_directory(p), flag, ": '", path, "' exists and is not a folder");
    KBN_CHECK(::access(p.c_str(), W_OK | X_OK) == 0, flag, ": the folder '", path, "' is not writable");
    return;
  }
  fs::path ancestor = p.parent_path();
  while (!fs::exists(ancestor) && ancestor.has_parent_path() && ancestor != ancestor.parent_path())
    ancestor = ancestor.parent_path();
  KBN_CHECK(fs::is_directory(ancestor), flag, ": cannot create '", path, "': '", ancestor.string(),
            "' is not a folder");
  KBN_CHECK(::access(ancestor.c_str(), W_OK | X_OK) == 0, flag, ": cannot create '", path, "': the folder '",
            ancestor.string(), "' is not writable");
}

size_t edit_distance(const std::string& a, const std::string& b) {
  // Optimal string alignment: insertions, deletions, substitutions and swaps of two neighbours cost 1 each.
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // Close enough to be a slip: up to a third of the word's length (at least 1, at most 3 edits), or a prefix.
  const size_t limit = std::clamp<size_t>(word.size() / 3, 1, 3);
  if (best_d <= limit) return best;
  for (const auto& c : candidates)
    if (word.size() >= 3 && c.rfind(word, 0) == 0) return c;
  return "";
}

std::string usage_message(CLI::App& app, const CLI::ParseError& e, int argc, const char* const* argv) {
  const std::vector<std::string> commands = visible_subcommands(app);
  CLI::App* sub = named_subcommand(app, argc, argv);
  const std::string what = e.what();
  if (!sub) {
    if (argc < 2)
      return "kb_nano: a command is needed, one of: " + join(commands) + " ('kb_nano --help' describes them)";
    const std::string word = argv[1];
    const std::string near = closest(word, commands);
    if (!word.empty() && word[0] == '-')
      return "kb_nano: unknown flag '" + word + "' before the command; the command comes first, one of: " +
             join(commands) + " (e.g. 'kb_nano generate --help')";
    return "kb_nano: unknown command '" + word + "'" + (near.empty() ? "" : "; did you mean '" + near + "'?") +
           " Commands: " + join(commands) + " ('kb_nano --help' describes them)";
  }
  const std::string name = sub->get_name();
  const std::string prefix = "kb_nano " + name + ": ";
  const std::string help = " ('kb_nano " + name + " --help' lists its flags)";
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
    const std::vector<std::string> known = flag_names(*sub, false), shown = flag_names(*sub, true);
    std::vector<std::string> unexpected;
    for (int i = 2; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "--") break;
      if (a.size() < 2 || a[0] != '-' || looks_like_number(a)) continue;
      a = a.substr(0, a.find('='));
      if (std::find(known.begin(), known.end(), a) != known.end()) continue;
      const std::string near = closest(a, shown);
      return prefix + "unknown flag '" + a + "'" + (near.empty() ? "" : "; did you mean '" + near + "'?") + help;
    }
    // No unknown flag: words the command takes no place for (a value given to a flag that takes none, or a second
    // value of a single-valued flag).
    static const std::regex extras(R"(^The following arguments? (?:was|were) not expected: (.*)$)");
    std::smatch m;
    const std::string words = std::regex_match(what, m, extras) ? m[1].str() : what;
    return prefix + "unexpected argument(s) '" + words + "': no flag or position takes them" + help;
  }
  std::smatch m;
  static const std::regex at_most(R"(^(\S+): At Most (\d+) required but received (\d+)$)");
  if (std::regex_match(what, m, at_most))
    return prefix + m[1].str() + ": given " + m[3].str() + " times; give it " +
           (m[2].str() == "1" ? std::string("once") : "at most " + m[2].str() + " times") + help;
  static const std::regex missing_value(R"(^(\S+): (\d+) required (\S+) missing$)");
  if (std::regex_match(what, m, missing_value)) return prefix + m[1].str() + ": needs a value" + help;
  static const std::regex conversion(R"(^Could not convert: (\S+) = (.*)$)");
  if (std::regex_match(what, m, conversion))
    return prefix + m[1].str() + ": expected a number, got '" + m[2].str() + "'" + help;
  static const std::regex required(R"(^(\S+) is required$)");
  if (std::regex_match(what, m, required)) {
    const std::string arg = m[1].str();
    return prefix + (arg.rfind("-", 0) == 0 ? "the flag " + arg + " is needed" : "missing the " + arg + " to read") +
           help;
  }
  // Validation errors come from this file's validators ("--flag: expected ..."); anything else as CLI11 says it.
  return prefix + what + help;
}

std::string csv_field(const std::string& v) {
  if (v.find_first_of(",\"\n\r") == std::string::npos) return v;
  std::string q = "\"";
  for (char c : v) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string csv_line(const std::vector<std::string>& fields) {
  std::string line;
  for (size_t i = 0; i < fields.size(); ++i) line += (i ? "," : "") + csv_field(fields[i]);
  return line + "\n";
}

}  // namespace kbn::cli
