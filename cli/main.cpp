// kb_nano: one binary, one subcommand per job.
#include <cstdio>

#include "cli/commands.h"
#include "kbn/error.h"

int main(int argc, char** argv) {
  CLI::App app{"kb-nano: baseline LLM kernels L1..L4, candidates, and the benchmarks that judge them"};
  app.require_subcommand(1);
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
    return app.exit(e);
  } catch (const kbn::Error& e) {
    std::fprintf(stderr, "kb_nano: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
