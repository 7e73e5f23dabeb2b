#pragma once
// `kb_nano profile --sass-csv`: where a kernel's warps spend their time, instruction by instruction, from Nsight
// Compute's source page (`ncu --set full --import-source yes -o rep ...`, then `ncu -i rep.ncu-rep --page source
// --print-source sass --csv`): per SASS instruction, the warp-state samples (all, and by stall reason) and the
// instructions executed. Two views of it:
//   - hot instructions: the instructions with the most samples and the stall reasons behind them (a stall is charged
//     to the instruction that waits: the one after a barrier, the use of a load's register);
//   - regions: the instruction stream cut after every synchronisation point (barriers, mbarrier waits and arrives,
//     wgmma and scoreboard waits, exits), so that a loop's phases (issue the MMAs, wait for them, the softmax, hand
//     over to the next warpgroup) show up as separate rows with their share of the samples and of the instructions.
// Needs no GPU: the tests run it on a recorded capture (tests/fixtures/ncu/).
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kbn::bench {

struct SassInstruction {
  std::string address;  // "0x7f63ef7bd500"
  std::string source;   // the SASS text, trimmed: "@!P0 BRA 0x7f63ef7cb7c0"
  int64_t samples = 0;     // warp-state samples at this instruction (all)
  int64_t not_issued = 0;  // of which the warp was not issued
  int64_t executed = 0;    // warp-level instructions executed
  std::map<std::string, int64_t> stalls;  // reason ("barrier", "long_sb", ...) -> samples
};

struct SassKernel {
  std::string name;
  std::vector<SassInstruction> instructions;
  int64_t samples() const;
  int64_t executed() const;
  std::map<std::string, int64_t> stalls() const;  // summed over the instructions
};

// Parses ncu's source page as CSV: a `"Kernel Name","<name>"` line starts each kernel, the header row after it names
// the columns (Address, Source, Warp Stall Sampling (All Samples), ... (Not-issued Samples), Instructions Executed,
// and stall_<reason> for each reason; "(Not Issued)" variants are ignored), one row per instruction. Numbers may carry
// thousands separators. Throws kbn::Error naming what is missing when there is no kernel, or a kernel's header lacks
// Source, the samples or the executed column.
std::vector<SassKernel> parse_ncu_source_csv(const std::string& text);

// True for the instructions after which a region ends (BAR.*, SYNCS.* (mbarrier), WARPGROUP.DEPBAR, DEPBAR, EXIT,
// RET), predicated or not.
bool is_sync_instruction(const std::string& source);

struct SassRegion {
  size_t first = 0, last = 0;  // instruction indices, inclusive
  int64_t samples = 0, executed = 0;
  std::vector<std::pair<std::string, int64_t>> top_stalls;  // by samples, at most 3
};

// The kernel's instructions cut after every is_sync_instruction (after the branch that follows an mbarrier
// try-wait, which carries the wait's stalls); regions that never executed are left out. In instruction order.
std::vector<SassRegion> sass_regions(const SassKernel& k);

// The kernel's `n` instructions with the most samples, as indices, most first.
std::vector<size_t> hot_instructions(const SassKernel& k, size_t n);

// The kernel's `n` regions with the most samples, most first.
std::vector<SassRegion> hot_regions(const SassKernel& k, size_t n);

// The report `kb_nano profile --sass-csv` prints: per kernel, the totals and stall mix, the hot instructions and
// the regions holding the most samples (`top` rows each).
std::string sass_report(const std::vector<SassKernel>& kernels, size_t top);

}  // namespace kbn::bench
