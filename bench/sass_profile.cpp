#include "bench/sass_profile.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <sstream>

#include "bench/profile.h"
#include "kbn/error.h"

namespace kbn::bench {
namespace {

// A count cell: empty or text -> 0 (ncu leaves cells empty where nothing was sampled).
int64_t count_cell(const std::string& cell) { return int64_t(parse_number(cell).value_or(0)); }

// The SASS opcode: the first word after an optional guard predicate ("@!P0 BRA ..." -> "BRA").
std::string opcode(const std::string& source) {
  std::istringstream in(source);
  std::string word;
  in >> word;
  if (!word.empty() && word[0] == '@') in >> word;
  return word;
}

std::string pct(int64_t part, int64_t whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", whole > 0 ? 100.0 * double(part) / double(whole) : 0.0);
  return buf;
}

std::vector<std::pair<std::string, int64_t>> ranked(const std::map<std::string, int64_t>& m, size_t n) {
  std::vector<std::pair<std::string, int64_t>> v;
  for (const auto& [k, c] : m)
    if (c > 0) v.emplace_back(k, c);
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  if (v.size() > n) v.resize(n);
  return v;
}

std::string stall_mix(const std::vector<std::pair<std::string, int64_t>>& v, int64_t whole) {
  std::string s;
  for (const auto& [k, c] : v) s += (s.empty() ? "" : ", ") + k + " " + pct(c, whole);
  return s.empty() ? "-" : s;
}

std::string clip(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n - 3) + "..."; }

}  // namespace

int64_t SassKernel::samples() const {
  int64_t n = 0;
  for (const auto& i : instructions) n += i.samples;
  return n;
}

int64_t SassKernel::executed() const {
  int64_t n = 0;
  for (const auto& i : instructions) n += i.executed;
  return n;
}

std::map<std::string, int64_t> SassKernel::stalls() const {
  std::map<std::string, int64_t> m;
  for (const auto& i : instructions)
    for (const auto& [k, c] : i.stalls) m[k] += c;
  return m;
}

std::vector<SassKernel> parse_ncu_source_csv(const std::string& text) {
  std::vector<SassKernel> kernels;
  std::istringstream in(text);
  std::string line;
  std::vector<std::string> cells;
  // Column positions of the current kernel's header; -1 until a header is read.
  int col_address = -1, col_source = -1, col_samples = -1, col_not_issued = -1, col_executed = -1, need = 0;
  std::vector<std::pair<int, std::string>> col_stalls;
  bool have_header = false;
  while (std::getline(in, line)) {
    if (!split_csv(line, cells) || cells.empty()) continue;
    if (trim(cells[0]) == "Kernel Name") {
      KBN_CHECK(cells.size() >= 2, "ncu source page: a 'Kernel Name' line without the name: ", clip(line, 80));
      kernels.push_back(SassKernel{trim(cells[1]), {}});
      have_header = false;
      continue;
    }
    if (kernels.empty()) continue;  // ==PROF== lines and the like before the first kernel
    if (!have_header) {
      col_address = col_source = col_samples = col_not_issued = col_executed = -1;
      col_stalls.clear();
      for (size_t c = 0; c < cells.size(); ++c) {
        const std::string h = trim(cells[c]);
        if (h == "Address") col_address = int(c);
        if (h == "Source") col_source = int(c);
        if (h == "Warp Stall Sampling (All Samples)") col_samples = int(c);
        if (h == "Warp Stall Sampling (Not-issued Samples)") col_not_issued = int(c);
        if (h == "Instructions Executed") col_executed = int(c);
        if (h.rfind("stall_", 0) == 0 && h.find("Not Issued") == std::string::npos)
          col_stalls.emplace_back(int(c), h.substr(6));
      }
      const SassKernel& k = kernels.back();
      KBN_CHECK(col_source >= 0 && col_samples >= 0 && col_executed >= 0, "ncu source page: kernel '",
                clip(k.name, 80), "': the header row lacks ",
                col_source < 0 ? "'Source'" : col_samples < 0 ? "'Warp Stall Sampling (All Samples)'"
                                                               : "'Instructions Executed'",
                " (export it with: ncu -i REPORT --page source --print-source sass --csv; the report needs "
                "--set full or the SourceCounters and WarpStateStats sections)");
      need = std::max({col_source, col_samples, col_executed, col_address, col_not_issued});
      have_header = true;
      continue;
    }
    if (int(cells.size()) <= need) continue;
    SassInstruction ins;
    if (col_address >= 0) ins.address = trim(cells[size_t(col_address)]);
    ins.source = trim(cells[size_t(col_source)]);
    ins.samples = count_cell(cells[size_t(col_samples)]);
    if (col_not_issued >= 0) ins.not_issued = count_cell(cells[size_t(col_not_issued)]);
    ins.executed = count_cell(cells[size_t(col_executed)]);
    for (const auto& [c, reason] : col_stalls)
      if (size_t(c) < cells.size())
        if (const int64_t n = count_cell(cells[size_t(c)]); n > 0) ins.stalls[reason] = n;
    kernels.back().instructions.push_back(std::move(ins));
  }
  KBN_CHECK(!kernels.empty(), "ncu source page: no 'Kernel Name' line (expected the output of: ncu -i REPORT "
            "--page source --print-source sass --csv)");
  for (const auto& k : kernels)
    KBN_CHECK(!k.instructions.empty(), "ncu source page: kernel '", clip(k.name, 80), "' has no instruction rows");
  return kernels;
}

bool is_sync_instruction(const std::string& source) {
  const std::string op = opcode(source);
  for (const char* p : {"BAR.", "SYNCS.", "WARPGROUP.DEPBAR", "DEPBAR"})
    if (op.rfind(p, 0) == 0) return true;
  return op == "BAR" || op == "EXIT" || op == "RET" || op.rfind("RET.", 0) == 0;
}

namespace {

bool is_try_wait(const SassInstruction& ins) { return opcode(ins.source).find("TRYWAIT") != std::string::npos; }

// A region ends after a synchronisation point and after the last instruction. An mbarrier wait is a try-wait and a
// branch back to it: the branch, which carries the wait's stalls, ends the region.
bool ends_region(const SassKernel& k, size_t i) {
  const std::vector<SassInstruction>& v = k.instructions;
  if (i + 1 == v.size()) return true;
  const bool branch = opcode(v[i].source) == "BRA";
  if (branch) return i > 0 && is_try_wait(v[i - 1]);
  if (is_try_wait(v[i]) && opcode(v[i + 1].source) == "BRA") return false;
  return is_sync_instruction(v[i].source);
}

}  // namespace

std::vector<SassRegion> sass_regions(const SassKernel& k) {
  std::vector<SassRegion> out;
  SassRegion r;
  std::map<std::string, int64_t> stalls;
  auto close = [&](size_t last) {
    r.last = last;
    if (r.executed > 0 || r.samples > 0) {
      r.top_stalls = ranked(stalls, 3);
      out.push_back(r);
    }
    r = SassRegion{};
    r.first = last + 1;
    stalls.clear();
  };
  for (size_t i = 0; i < k.instructions.size(); ++i) {
    const SassInstruction& ins = k.instructions[i];
    r.samples += ins.samples;
    r.executed += ins.executed;
    for (const auto& [reason, c] : ins.stalls) stalls[reason] += c;
    if (ends_region(k, i)) close(i);
  }
  return out;
}

std::vector<size_t> hot_instructions(const SassKernel& k, size_t n) {
  std::vector<size_t> idx(k.instructions.size());
  std::iota(idx.begin(), idx.end(), size_t(0));
  std::stable_sort(idx.begin(), idx.end(),
                   [&](size_t a, size_t b) { return k.instructions[a].samples > k.instructions[b].samples; });
  while (!idx.empty() && k.instructions[idx.back()].samples == 0) idx.pop_back();
  if (idx.size() > n) idx.resize(n);
  return idx;
}

std::vector<SassRegion> hot_regions(const SassKernel& k, size_t n) {
  std::vector<SassRegion> regions = sass_regions(k);
  std::stable_sort(regions.begin(), regions.end(),
                   [](const SassRegion& a, const SassRegion& b) { return a.samples > b.samples; });
  if (regions.size() > n) regions.resize(n);
  return regions;
}

std::string sass_report(const std::vector<SassKernel>& kernels, size_t top) {
  std::ostringstream o;
  for (const SassKernel& k : kernels) {
    const int64_t samples = k.samples(), executed = k.executed();
    o << "kernel " << k.name << "\n"
      << "  " << k.instructions.size() << " SASS instructions, " << executed << " executed (warp level), " << samples
      << " warp samples; stalls: " << stall_mix(ranked(k.stalls(), 6), samples) << "\n";
    o << "  hot instructions (index, address, SASS: share of samples; its stalls):\n";
    for (size_t i : hot_instructions(k, top)) {
      const SassInstruction& ins = k.instructions[i];
      o << "    #" << i << " " << ins.address << " " << clip(ins.source, 60) << ": " << pct(ins.samples, samples)
        << "; " << stall_mix(ranked(ins.stalls, 2), ins.samples) << "\n";
    }
    o << "  regions between synchronisation points (instructions, ending at: share of samples, share of executed "
         "instructions; stalls):\n";
    for (const SassRegion& r : hot_regions(k, top))
      o << "    #" << r.first << "-#" << r.last << " ending at " << clip(k.instructions[r.last].source, 44) << ": "
        << pct(r.samples, samples) << ", " << pct(r.executed, executed) << "; " << stall_mix(r.top_stalls, r.samples)
        << "\n";
  }
  return o.str();
}

}  // namespace kbn::bench
