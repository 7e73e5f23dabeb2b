#pragma once
#include <CLI/CLI.hpp>

namespace kbn::cli {
// Each adds its subcommand to the app; the callback runs it.
void add_list_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_stubs_command(CLI::App& app);
void add_kernels_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_profile_command(CLI::App& app);
void add_report_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
}  // namespace kbn::cli
