// kb_nano report: result files of `kb_nano eval --json` and `kb_nano kernels --json` turned into SVG plots and
// an index with the key numbers (bench/report.h).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/report.h"
#include "cli/args.h"
#include "cli/commands.h"

namespace kbn::cli {
namespace {

struct Options {
  std::vector<std::string> files;
  bench::ReportOptions report;
};

void run(const Options& o) {
  check_output_dir("--out", o.report.out_dir);
  // Every file is read before anything is written: a bad file fails the command without a partial report.
  // A file that cannot be read or is not a result is a wrong argument (exit 2). A merged kernels file (top-level
  // 'runs') gives one result per run.
  std::vector<bench::ResultFile> results;
  for (const auto& path : o.files) {
    try {
      for (auto& r : bench::load_results(path)) results.push_back(std::move(r));
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
  }
  for (const auto& path : bench::write_report(results, o.report)) std::printf("%s\n", path.c_str());
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "report",
      "Plot result files of 'kb_nano eval --json' and 'kb_nano kernels --json' as SVG "
      "(throughput and latency per workload, alignment, the serial floor and its "
      "share per op, speedup and % of the ceilings per case) with an index.md and index.html of the key numbers");
  cmd->add_option("files", o->files,
                  "Result JSON files (eval and kernels results may be mixed; a merged kernels file, with a top-level "
                  "'runs' array of kernels results, counts as one file per run)")
      ->required();
  cmd->add_option("--out", o->report.out_dir, "Folder for the plots and the index (default: report)");
  cmd->add_option("--title", o->report.title, "Title of the index (default: kb_nano report)");
  cmd->callback([o] { run(*o); });
}

}  // namespace kbn::cli
