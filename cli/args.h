#pragma once
// What every subcommand shares about its command line: value checks in the tool's own words (CLI11's defaults
// print "Value 0 not in range 0.000000 to 1797..."), output paths checked before any work, "did you mean"
// suggestions, and the translation of CLI11's parse errors.
//
// Exit codes of kb_nano (also in `kb_nano --help` and README.md):
//   0  success (and --help)
//   1  the run failed: an error while loading or running, or a check that did not pass (kernels' FAILs)
//   2  usage error: the command line cannot be parsed, or a flag's value or an input file it names is refused.
//      Every refusal of a flag's value starts with the flag's name ("--json: ..."), which is how main() tells it
//      from a failed run; other refusals of the command line throw UsageError.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "kbn/error.h"

namespace kbn::cli {

// A usage error found after parsing whose message does not start with a flag: an input file named on the command
// line that cannot be read or is not what the command takes (kb_nano report's result files). Exit 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

inline constexpr int kExitOk = 0, kExitFailed = 1, kExitUsage = 2;
inline constexpr const char* kExitCodesHelp =
    "Exit codes: 0 success; 1 the run failed (an error while loading or running, or a check that did not pass); "
    "2 usage error (the command line cannot be parsed, or a flag's value is refused).";

// An integer >= min ("--max-new-tokens: expected an integer >= 1, got '0'"). `what` replaces "an integer".
CLI::Validator integer_at_least(int64_t min, const std::string& what = "an integer");
// An integer in [lo, hi]; `meaning` follows the range in the message ("1 (single kernels), 2 ...").
CLI::Validator integer_in(int64_t lo, int64_t hi, const std::string& meaning = "");
// A seed: an integer 0..2^64-1 ("-1" is refused instead of wrapping to 2^64-1).
CLI::Validator seed_value();
// A number > 0 (or >= 0 when zero_ok).
CLI::Validator positive_number(bool zero_ok = false);
// A fraction in [0, 1) (vLLM's --random-range-ratio).
CLI::Validator fraction_below_one();
// A fraction in (0, 1] (top-p, a share of GPU memory).
CLI::Validator fraction_up_to_one();
// One of `choices`, with a "did you mean" for a misspelling.
CLI::Validator one_of(const std::vector<std::string>& choices);

// An output file named by `flag`: refused (kbn::Error starting with the flag) unless its folder exists and is
// writable and the path is not a folder. Nothing is created. An empty path is no output and passes.
void check_output_file(const std::string& flag, const std::string& path);
// An output folder created by the command: it may exist (as a folder) or not, but its nearest existing
// ancestor must be a writable folder.
void check_output_dir(const std::string& flag, const std::string& path);

// Edit distance (optimal string alignment: a swap of two neighbouring characters counts 1).
size_t edit_distance(const std::string& a, const std::string& b);
// The candidate closest to `word` when it is close enough to be a likely misspelling, else "".
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

// The message for a CLI11 parse error of `argv` on `app`, in the tool's words: unknown commands and flags with
// "did you mean", repeated flags, missing values and arguments. The subcommand named in argv[1], when any, is
// used to name the flags it knows.
std::string usage_message(CLI::App& app, const CLI::ParseError& e, int argc, const char* const* argv);

// One CSV field (RFC 4180): quoted, with inner quotes doubled, when it holds a comma, a quote or a line break.
std::string csv_field(const std::string& v);
// One CSV line of `fields`, with its line break.
std::string csv_line(const std::vector<std::string>& fields);

}  // namespace kbn::cli
