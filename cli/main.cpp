// kb_nano: one binary, one subcommand per job.
#include <cstdio>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "kbn/error.h"

int main(int argc, char** argv) {
  CLI::App app{"kb-nano: baseline LLM kernels L1..L4, candidates, and the benchmarks that judge them"};
  app.require_subcommand(1);
  app.footer(kbn::cli::kExitCodesHelp);
  kbn::cli::add_list_command(app);
  kbn::cli::add_generate_command(app);
  kbn::cli::add_stubs_command(app);
  kbn::cli::add_kernels_command(app);
  kbn::cli::add_eval_command(app);
  kbn::cli::add_profile_command(app);
  kbn::cli::add_report_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "%s\n", kbn::cli::usage_message(app, e, argc, argv).c_str());
    return kbn::cli::kExitUsage;
  } catch (const kbn::Error& e) {
    std::fprintf(stderr, "kb_nano: error: %s\n", e.what());
    // A refused flag value names the flag first (cli/args.h): a usage error. Anything else is a failed run.
    const bool usage = dynamic_cast<const kbn::cli::UsageError*>(&e) || std::string(e.what()).rfind("--", 0) == 0;
    return usage ? kbn::cli::kExitUsage : kbn::cli::kExitFailed;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kb_nano: error: %s\n", e.what());
    return kbn::cli::kExitFailed;
  }
  return kbn::cli::kExitOk;
}
