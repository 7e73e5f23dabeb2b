// kb_nano: one binary, one subcommand per job.
#include <cstdio>
#include <sstream>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "kbn/device.h"
#include "kbn/error.h"
#include "kbn/version.h"
#ifdef KBN_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace {

// `kb_nano --version`: the build (commit, type, the CUDA toolkit and the GPU code it holds) and the GPUs this
// process sees, with their compute capability (the binary runs its Hopper kernels on sm_90 only).
std::string version_text() {
  const kbn::BuildInfo& b = kbn::build_info();
  std::ostringstream os;
  os << "kb_nano " << b.git_commit << " (" << b.build_type << ")\n";
  if (!b.with_cuda) {
    os << "CUDA: not built (CPU only)";
    return os.str();
  }
  os << "CUDA: toolkit " << b.cuda_version << ", GPU code " << b.cuda_flags;
#ifdef KBN_WITH_CUDA
  int driver = 0, runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess)
    os << "; runtime " << runtime / 1000 << "." << runtime % 1000 / 10;
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0)  // 0: no driver installed
    os << ", driver " << driver / 1000 << "." << driver % 1000 / 10;
  const int n = kbn::cuda_available() ? kbn::cuda_device_count() : 0;
  if (n == 0) os << "\nGPU: none visible";
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    os << "\nGPU " << i << ": " << p.name << " (sm_" << p.major << p.minor << ", " << p.multiProcessorCount << " SMs, "
       << double(p.totalGlobalMem) / double(1ull << 30) << " GiB)";
  }
#endif
  return os.str();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kb-nano: baseline LLM kernels L1..L4, candidates, and the benchmarks that judge them"};
  app.require_subcommand(1);
  app.footer(kbn::cli::kExitCodesHelp);
  app.set_version_flag("--version", version_text,
                       "Print the build (commit, CUDA toolkit, GPU code) and the GPUs seen, then exit");
  kbn::cli::add_list_command(app);
  kbn::cli::add_generate_command(app);
  kbn::cli::add_stubs_command(app);
  kbn::cli::add_kernels_command(app);
  kbn::cli::add_eval_command(app);
  kbn::cli::add_profile_command(app);
  kbn::cli::add_report_command(app);
  kbn::cli::add_bench_command(app);
  kbn::cli::add_serve_command(app);
  kbn::cli::add_tokenize_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "%s\n", kbn::cli::usage_message(app, e, argc, argv).c_str());
    return kbn::cli::kExitUsage;
  } catch (const kbn::Error& e) {
    std::fprintf(stderr, "kb_nano: error: %s\n", e.what());
    // A refused flag value names the flag first ("--json: ...", "-p: ..."; cli/args.h): a usage error. Anything
    // else is a failed run.
    const bool usage = dynamic_cast<const kbn::cli::UsageError*>(&e) || std::string(e.what()).rfind("-", 0) == 0;
    return usage ? kbn::cli::kExitUsage : kbn::cli::kExitFailed;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kb_nano: error: %s\n", e.what());
    return kbn::cli::kExitFailed;
  }
  return kbn::cli::kExitOk;
}
