// kb_nano report: reading eval and kernels result files (tests/fixtures/report/, made by the CPU commands in
// the README there), the refusals that name the file and key, the SVG writer, the plots each result gets, the
// index, and the CLI end to end.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "bench/report.h"
#include "kbn/error.h"
#include "test_errors.h"
#include "test_paths.h"
#include "test_process.h"

using namespace kbn;
using kbn::test::error_of;

namespace {

namespace fs = std::filesystem;

std::string fixture(const std::string& name) { return kbn::test::fixture_dir() + "/report/" + name; }

std::string read(const std::string& path) { return kbn::test::read_file(path); }

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t i = text.find(needle); i != std::string::npos; i = text.find(needle, i + needle.size())) ++n;
  return n;
}

// "" when the document is well formed as far as a chart needs: every tag closed in order, one root element,
// no '<' or bare '&' in text or attribute values.
std::string xml_problem(const std::string& doc) {
  std::vector<std::string> open;
  int roots = 0;
  size_t i = 0;
  while (true) {
    const size_t lt = doc.find('<', i);
    const std::string text = doc.substr(i, lt == std::string::npos ? std::string::npos : lt - i);
    static const std::regex bare_amp("&(?!(amp|lt|gt|quot|apos);)");
    if (std::regex_search(text, bare_amp)) return "bare '&' in text: " + text;
    if (lt == std::string::npos) break;
    const size_t gt = doc.find('>', lt);
    if (gt == std::string::npos) return "unterminated tag at " + std::to_string(lt);
    const std::string tag = doc.substr(lt + 1, gt - lt - 1);
    if (tag.find('<') != std::string::npos) return "'<' inside a tag: " + tag;
    if (std::regex_search(tag, bare_amp)) return "bare '&' in a tag: " + tag;
    i = gt + 1;
    if (tag.empty() || tag[0] == '?' || tag[0] == '!') continue;
    if (tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (open.empty() || open.back() != name)
        return "</" + name + "> closes <" + (open.empty() ? std::string("nothing") : open.back()) + ">";
      open.pop_back();
      continue;
    }
    const std::string name = tag.substr(0, tag.find_first_of(" \t\n/"));
    if (open.empty()) ++roots;
    if (tag.back() != '/') open.push_back(name);
  }
  if (!open.empty()) return "<" + open.back() + "> is never closed";
  if (roots != 1) return std::to_string(roots) + " root elements";
  return "";
}

bench::Plot find_plot(const std::vector<bench::Plot>& plots, const std::string& file) {
  for (const auto& p : plots)
    if (p.file == file) return p;
  ADD_FAILURE() << "no plot " << file;
  return {};
}

std::vector<std::string> names(const std::vector<bench::Plot>& plots) {
  std::vector<std::string> out;
  for (const auto& p : plots) out.push_back(p.file);
  return out;
}

const char* const kEvalFixtures[] = {"eval_balanced_vs_candidate.json", "eval_decode-heavy_vs_candidate.json",
                                     "eval_latency-b1_baseline.json"};

}  // namespace

// ---- reading result files ----

TEST(ReportParse, EvalWithCandidateAndAlignment) {
  const auto f = bench::load_result(fixture("eval_decode-heavy_vs_candidate.json"));
  ASSERT_EQ(f.kind, bench::ResultKind::eval);
  const auto& e = f.eval;
  EXPECT_EQ(e.workload, "decode-heavy");
  EXPECT_EQ(e.model, "tiny-llama");
  EXPECT_EQ(e.device, "cpu (AMD EPYC)");
  ASSERT_EQ(e.variants.size(), 2u);
  EXPECT_EQ(e.variants[0].name, "baseline");
  EXPECT_EQ(e.variants[1].name, "candidate");
  EXPECT_EQ(e.variants[0].num_requests, 8);
  EXPECT_GT(e.variants[0].output_tokens_per_s, 0);
  EXPECT_GT(e.variants[1].itl_s.count, 0);
  EXPECT_LE(e.variants[1].itl_s.p50, e.variants[1].itl_s.p99);
  ASSERT_TRUE(e.has_alignment);
  EXPECT_EQ(e.alignment.requests, 8);
  EXPECT_EQ(e.alignment.exact_match, 5);
  EXPECT_DOUBLE_EQ(e.alignment.exact_match_rate, 0.625);
  EXPECT_DOUBLE_EQ(e.alignment.mean_matching_prefix, 35.0);
  EXPECT_EQ(e.alignment.min_matching_prefix, 2);
  // The baseline's rerun at the 3 first divergences (fp8-rounded rms_norm: near-ties on this tiny model).
  ASSERT_TRUE(e.alignment.has_divergences);
  EXPECT_EQ(e.alignment.diverged, 3);
  EXPECT_EQ(e.alignment.scored, 3);
  EXPECT_NEAR(e.alignment.rank2_fraction, 2.0 / 3, 1e-12);
  EXPECT_GT(e.alignment.median_margin_over_std, 0);
  EXPECT_LE(e.alignment.median_margin_over_std, e.alignment.max_margin_over_std);
  EXPECT_FALSE(bench::load_result(fixture("eval_balanced_vs_candidate.json")).eval.alignment.has_divergences);
}

TEST(ReportParse, EvalBaselineOnly) {
  const auto f = bench::load_result(fixture("eval_latency-b1_baseline.json"));
  ASSERT_EQ(f.kind, bench::ResultKind::eval);
  EXPECT_EQ(f.eval.workload, "latency-b1");
  ASSERT_EQ(f.eval.variants.size(), 1u);
  EXPECT_NE(f.eval.find("baseline"), nullptr);
  EXPECT_EQ(f.eval.find("candidate"), nullptr);
  EXPECT_FALSE(f.eval.has_alignment);
}

TEST(ReportParse, KernelsBaselineVsCandidate) {
  const auto f = bench::load_result(fixture("kernels_rms_norm_vs_candidate.json"));
  ASSERT_EQ(f.kind, bench::ResultKind::kernels);
  const auto& k = f.kernels;
  EXPECT_TRUE(k.compare);
  EXPECT_EQ(k.mode, "cold");
  EXPECT_EQ(k.copy_gb_per_s, 0);  // CPU: no ceilings
  ASSERT_EQ(k.rows.size(), 4u);
  const std::vector<std::string> verdicts = {"PASS", "PASS", "FAIL", "FAIL"};
  for (size_t i = 0; i < 4; ++i) {
    const auto& r = k.rows[i];
    EXPECT_EQ(r.op, "rms_norm");
    EXPECT_EQ(r.model, "tiny-llama");
    EXPECT_EQ(r.verdict, verdicts[i]) << r.label;
    EXPECT_EQ(r.baseline.timed, i < 2) << r.label;
    EXPECT_EQ(r.candidate.timed, i < 2) << r.label;
    EXPECT_EQ(r.speedup > 0, i < 2) << r.label;
    EXPECT_EQ(r.pct_copy, -1) << r.label;
  }
  EXPECT_EQ(k.rows[0].label, "T=5 H=64");
  EXPECT_NE(k.rows[2].reason.find("tolerance"), std::string::npos);
}

TEST(ReportParse, KernelsBaselineOnly) {
  const auto f = bench::load_result(fixture("kernels_rms_norm_baseline.json"));
  ASSERT_EQ(f.kind, bench::ResultKind::kernels);
  EXPECT_FALSE(f.kernels.compare);
  ASSERT_EQ(f.kernels.rows.size(), 3u);
  for (const auto& r : f.kernels.rows) {
    EXPECT_TRUE(r.baseline.timed);
    EXPECT_GT(r.baseline.median_ms, 0);
    EXPECT_FALSE(r.candidate.timed);
  }
}

// The committed H200 results predate the validation contract: 'check' for the verdict, timing on the row.
TEST(ReportParse, KernelsEarlierFormatWithCeilings) {
  const auto f = bench::load_result(fixture("kernels_h200_subset.json"));
  ASSERT_EQ(f.kind, bench::ResultKind::kernels);
  const auto& k = f.kernels;
  EXPECT_FALSE(k.compare);
  EXPECT_EQ(k.device, "NVIDIA H200");
  EXPECT_NEAR(k.copy_gb_per_s, 4248.3, 0.1);
  EXPECT_NEAR(k.bf16_tflop_per_s, 782.6, 0.1);
  ASSERT_EQ(k.rows.size(), 4u);
  EXPECT_EQ(k.rows[0].verdict, "PASS");
  EXPECT_EQ(k.rows[1].verdict, "-");
  EXPECT_TRUE(k.rows[1].baseline.timed);
  EXPECT_NEAR(k.rows[1].baseline.median_ms, 0.074272, 1e-6);
  EXPECT_NEAR(k.rows[1].pct_copy, 85.08, 0.01);
  EXPECT_NEAR(k.rows[3].pct_bf16, 92.52, 0.01);
}

TEST(ReportParse, NotAResultNamesTheFileAndWhatWasExpected) {
  const std::string config = kbn::test::fixture_dir() + "/tiny-llama/config.json";
  const std::string e = error_of([&] { bench::load_result(config); });
  EXPECT_NE(e.find(config + ": not a kb_nano eval or kernels result"), std::string::npos) << e;
  EXPECT_NE(e.find("kb_nano eval --json"), std::string::npos) << e;
  EXPECT_NE(e.find("kb_nano kernels --json"), std::string::npos) << e;
  EXPECT_NE(e.find("top-level keys are: "), std::string::npos) << e;
  EXPECT_NE(e.find("hidden_size"), std::string::npos) << e;

  const std::string array = error_of([] { bench::parse_result("[1, 2]", "list.json"); });
  EXPECT_NE(array.find("list.json: not a kb_nano eval or kernels result"), std::string::npos) << array;
  EXPECT_NE(array.find("its top level is array"), std::string::npos) << array;

  const std::string bad = error_of([] { bench::parse_result("{\"rows\": [", "cut.json"); });
  EXPECT_EQ(bad.rfind("cut.json: not valid JSON", 0), 0u) << bad;
}

TEST(ReportParse, MissingOrUnreadableFile) {
  const std::string e = error_of([] { bench::load_result("/nonexistent/eval.json"); });
  EXPECT_EQ(e, "/nonexistent/eval.json: cannot read (No such file or directory)");
  const std::string dir = kbn::test::fixture_dir() + "/report";
  const std::string d = error_of([&] { bench::load_result(dir); });
  EXPECT_EQ(d, dir + ": is a folder, not a result file");
}

TEST(ReportParse, MissingKeyNamesFileAndPath) {
  auto eval = nlohmann::json::parse(read(fixture("eval_balanced_vs_candidate.json")));
  eval["results"]["candidate"]["ttft_s"].erase("p99");
  EXPECT_EQ(error_of([&] { bench::parse_result(eval.dump(), "broken_eval.json"); }),
            "broken_eval.json: missing key 'results.candidate.ttft_s.p99'");

  eval = nlohmann::json::parse(read(fixture("eval_balanced_vs_candidate.json")));
  eval.erase("config");
  EXPECT_EQ(error_of([&] { bench::parse_result(eval.dump(), "e.json"); }), "e.json: missing key 'config'");

  eval = nlohmann::json::parse(read(fixture("eval_balanced_vs_candidate.json")));
  eval["alignment"]["exact_match"] = "five";
  EXPECT_EQ(error_of([&] { bench::parse_result(eval.dump(), "e.json"); }),
            "e.json: key 'alignment.exact_match' should be an integer, got string");

  auto kernels = nlohmann::json::parse(read(fixture("kernels_rms_norm_vs_candidate.json")));
  kernels["rows"][1].erase("case");
  EXPECT_EQ(error_of([&] { bench::parse_result(kernels.dump(), "k.json"); }), "k.json: missing key 'rows[1].case'");

  kernels = nlohmann::json::parse(read(fixture("kernels_rms_norm_vs_candidate.json")));
  kernels["rows"][0]["candidate"].erase("median_ms");
  EXPECT_EQ(error_of([&] { bench::parse_result(kernels.dump(), "k.json"); }),
            "k.json: missing key 'rows[0].candidate.median_ms'");

  kernels = nlohmann::json::parse(read(fixture("kernels_rms_norm_vs_candidate.json")));
  kernels["rows"][3]["speedup"] = "fast";
  EXPECT_EQ(error_of([&] { bench::parse_result(kernels.dump(), "k.json"); }),
            "k.json: key 'rows[3].speedup' should be a number, got string");

  kernels["rows"] = nlohmann::json::array();
  EXPECT_NE(error_of([&] { bench::parse_result(kernels.dump(), "k.json"); }).find("k.json: key 'rows' is empty"),
            std::string::npos);
}

// ---- the SVG writer ----

TEST(ReportSvg, XmlEscape) {
  EXPECT_EQ(bench::xml_escape("a<b & 'c' > \"d\""), "a&lt;b &amp; &apos;c&apos; &gt; &quot;d&quot;");
  EXPECT_EQ(bench::xml_escape(std::string("x\x01y\tz\n", 6)), "xy\tz\n");
  EXPECT_EQ(bench::xml_escape("T=5 H=64"), "T=5 H=64");
}

TEST(ReportSvg, GroupedBarsWellFormedWithEscapedText) {
  bench::Figure f;
  f.title = "Speed <of> \"A\" & B";
  f.subtitle = "run's subtitle";
  bench::BarPanel p;
  p.title = "panel & co";
  p.y_label = "tokens/s";
  p.categories = {"<T=5>", "a & b", "plain"};
  p.series = {{"baseline", "#4e79a7", {10, 20, 30}, {}, {}},
              {"cand<idate>", "#f28e2b", {12, bench::kNoValue, 45.5}, {}, {"", "FAIL & co", ""}}};
  p.has_reference = true;
  p.reference = 25;
  p.reference_label = "ref";
  f.panels = {p, p};
  const std::string svg = bench::render_svg(f);
  EXPECT_EQ(xml_problem(svg), "") << svg;
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_EQ(count(svg, "class=\"bar\""), 10u);    // 2 panels x 5 values (one missing)
  EXPECT_EQ(count(svg, "class=\"value\""), 10u);  // a label per bar
  EXPECT_EQ(count(svg, "class=\"reference\""), 2u);
  EXPECT_EQ(count(svg, "class=\"category\""), 6u);
  EXPECT_EQ(count(svg, ">FAIL &amp; co</text>"), 2u);  // the note where the bar is missing
  EXPECT_NE(svg.find("Speed &lt;of&gt; &quot;A&quot; &amp; B"), std::string::npos);
  EXPECT_NE(svg.find("&lt;T=5&gt;"), std::string::npos);
  EXPECT_NE(svg.find(">cand&lt;idate&gt;</text>"), std::string::npos);  // legend
  EXPECT_NE(svg.find(">45.5</text>"), std::string::npos);
  EXPECT_NE(svg.find(">30.0</text>"), std::string::npos);
  EXPECT_EQ(svg.find("<svg", 10), svg.find("<svg"));  // one root
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(ReportSvg, LinearTicksCoverTheValuesAndLabels) {
  bench::Figure f;
  f.title = "t";
  bench::BarPanel p;
  p.title = "p";
  p.y_label = "ms";
  p.categories = {"a"};
  p.series = {{"s", "#000000", {97}, {}, {}}};
  f.panels = {p};
  const std::string svg = bench::render_svg(f);
  std::vector<double> ticks;
  static const std::regex tick("class=\"tick-label\"[^>]*>([0-9.e+-]+)</text>");
  for (std::sregex_iterator it(svg.begin(), svg.end(), tick), end; it != end; ++it)
    ticks.push_back(std::stod((*it)[1]));
  ASSERT_GE(ticks.size(), 3u);
  EXPECT_EQ(ticks.front(), 0);
  EXPECT_GT(ticks.back(), 97);  // room above the bar for its label
  EXPECT_LE(ticks.back(), 200);
}

TEST(ReportSvg, LogScaleDecades) {
  bench::Figure f;
  f.title = "t";
  bench::BarPanel p;
  p.title = "p";
  p.y_label = "us";
  p.categories = {"small", "large", "none"};
  p.series = {{"s", "#000000", {2, 3000, 0}, {}, {}}};
  p.log_scale = true;
  f.panels = {p};
  const std::string svg = bench::render_svg(f);
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "class=\"bar\""), 2u);  // 0 has no place on a log axis
  for (const char* t : {">1</text>", ">10</text>", ">100</text>", ">1000</text>", ">10000</text>"})
    EXPECT_NE(svg.find(t), std::string::npos) << t;
  EXPECT_NE(svg.find("us (log scale)"), std::string::npos);
}

// ---- plots per kind ----

TEST(ReportPlots, EvalAcrossWorkloads) {
  std::vector<bench::ResultFile> files;
  for (const char* name : kEvalFixtures) files.push_back(bench::load_result(fixture(name)));
  std::vector<const bench::ResultFile*> ptrs;
  for (const auto& f : files) ptrs.push_back(&f);
  const auto plots = bench::eval_plots(ptrs);
  EXPECT_EQ(names(plots), (std::vector<std::string>{"eval_throughput.svg", "eval_latency_balanced.svg",
                                                    "eval_latency_decode-heavy.svg", "eval_latency_latency-b1.svg",
                                                    "eval_alignment.svg"}));
  for (const auto& p : plots) EXPECT_EQ(xml_problem(bench::render_svg(p.figure)), "") << p.file;

  // Throughput: two panels x (2 + 2 + 1) bars; latency-b1 ran no candidate.
  const std::string thr = bench::render_svg(find_plot(plots, "eval_throughput.svg").figure);
  EXPECT_EQ(count(thr, "class=\"bar\""), 10u);
  EXPECT_EQ(count(thr, ">not run</text>"), 2u);
  const auto& base = files[0].eval.variants[0];
  EXPECT_NE(thr.find(">" + std::to_string(int(std::lround(base.output_tokens_per_s))) + "</text>"), std::string::npos);
  for (const char* w : {">balanced</text>", ">decode-heavy</text>", ">latency-b1</text>"})
    EXPECT_EQ(count(thr, w), 2u) << w;

  // Latency: 4 panels (TTFT, TPOT, ITL, E2E) x 3 percentiles x variants.
  const std::string lat2 = bench::render_svg(find_plot(plots, "eval_latency_balanced.svg").figure);
  EXPECT_EQ(count(lat2, "class=\"bar\""), 24u);
  const std::string lat1 = bench::render_svg(find_plot(plots, "eval_latency_latency-b1.svg").figure);
  EXPECT_EQ(count(lat1, "class=\"bar\""), 12u);
  for (const char* t : {"TTFT", "TPOT", "ITL", "E2E", ">p50</text>", ">p90</text>", ">p99</text>"})
    EXPECT_NE(lat1.find(t), std::string::npos) << t;

  // Alignment: only the two compared workloads; rate bars + (prefix, output length) bars.
  const std::string al = bench::render_svg(find_plot(plots, "eval_alignment.svg").figure);
  EXPECT_EQ(count(al, "class=\"bar\""), 6u);
  EXPECT_NE(al.find(">62.5%</text>"), std::string::npos);
  EXPECT_NE(al.find(">100%</text>"), std::string::npos);
  EXPECT_NE(al.find(">35.0</text>"), std::string::npos);
  EXPECT_EQ(al.find("latency-b1"), std::string::npos);
}

TEST(ReportPlots, EvalSameWorkloadTwice) {
  const auto f = bench::load_result(fixture("eval_balanced_vs_candidate.json"));
  const auto plots = bench::eval_plots({&f, &f});
  EXPECT_EQ(names(plots), (std::vector<std::string>{
                              "eval_throughput.svg", "eval_latency_balanced_eager_eval_balanced_vs_candidate.svg",
                              "eval_latency_balanced_eager_eval_balanced_vs_candidate_2.svg", "eval_alignment.svg"}));
}

// The same workload in eager and graph mode: the modes name the plots, no file names needed.
TEST(ReportPlots, EvalSameWorkloadInTwoModes) {
  const auto eager = bench::load_result(fixture("eval_balanced_vs_candidate.json"));
  auto graph = eager;
  graph.eval.mode = "graph";
  const auto plots = bench::eval_plots({&eager, &graph});
  EXPECT_EQ(names(plots), (std::vector<std::string>{"eval_throughput.svg", "eval_latency_balanced_eager.svg",
                                                    "eval_latency_balanced_graph.svg", "eval_alignment.svg"}));
}

TEST(ReportPlots, KernelsSpeedupColouredByVerdict) {
  const auto f = bench::load_result(fixture("kernels_rms_norm_vs_candidate.json"));
  const auto plots = bench::kernels_plots(f);
  EXPECT_EQ(names(plots), (std::vector<std::string>{"kernels_rms_norm_tiny-llama_tp1_speedup.svg",
                                                    "kernels_rms_norm_tiny-llama_tp1_time.svg"}));
  const std::string sp = bench::render_svg(plots[0].figure);
  EXPECT_EQ(xml_problem(sp), "");
  EXPECT_EQ(count(sp, "class=\"bar\""), 2u);  // the FAIL cases were not timed
  EXPECT_EQ(count(sp, "class=\"bar\" x="), 2u);
  EXPECT_EQ(count(sp, "fill=\"#59a14f\"><title>"), 2u);  // both timed cases PASS: green
  EXPECT_EQ(count(sp, ">FAIL</text>"), 2u);              // written where their bars would be
  EXPECT_EQ(count(sp, "class=\"reference\""), 1u);
  EXPECT_NE(sp.find(">1.0x</text>"), std::string::npos);
  EXPECT_NE(sp.find(">FAIL / ERROR</text>"), std::string::npos);
  char speedup[32];
  std::snprintf(speedup, sizeof speedup, ">%.2fx</text>", f.kernels.rows[0].speedup);
  EXPECT_NE(sp.find(speedup), std::string::npos) << speedup;
  EXPECT_NE(sp.find("geometric mean over passing cases"), std::string::npos);
  for (const auto& r : f.kernels.rows) EXPECT_NE(sp.find(bench::xml_escape(r.label)), std::string::npos) << r.label;

  const std::string t = bench::render_svg(plots[1].figure);
  EXPECT_EQ(count(t, "class=\"bar\""), 4u);  // 2 timed cases x baseline, candidate
  EXPECT_EQ(count(t, ">not timed</text>"), 4u);
}

TEST(ReportPlots, KernelsBaselineOnlyHasNoSpeedup) {
  const auto f = bench::load_result(fixture("kernels_rms_norm_baseline.json"));
  const auto plots = bench::kernels_plots(f);
  EXPECT_EQ(names(plots), (std::vector<std::string>{"kernels_rms_norm_tiny-llama_tp1_time.svg"}));
  const std::string t = bench::render_svg(plots[0].figure);
  EXPECT_EQ(count(t, "class=\"bar\""), 3u);
  EXPECT_NE(t.find(">baseline</text>"), std::string::npos);  // a legend even with one series
}

TEST(ReportPlots, KernelsCeilingsPerGroup) {
  const auto f = bench::load_result(fixture("kernels_h200_subset.json"));
  const auto plots = bench::kernels_plots(f);
  EXPECT_EQ(names(plots), (std::vector<std::string>{
                              "kernels_rms_norm_llama-3.1-8b-instruct_tp1_time.svg",
                              "kernels_rms_norm_llama-3.1-8b-instruct_tp1_ceiling.svg",
                              "kernels_linear_llama-3.1-8b-instruct_tp1_time.svg",
                              "kernels_linear_llama-3.1-8b-instruct_tp1_ceiling.svg",
                          }));
  const std::string c = bench::render_svg(plots[3].figure);
  EXPECT_EQ(xml_problem(c), "");
  EXPECT_EQ(count(c, "class=\"bar\""), 4u);  // 2 cases x (% copy, % bf16)
  EXPECT_NE(c.find(">92.5%</text>"), std::string::npos);
  EXPECT_NE(c.find(">45.1%</text>"), std::string::npos);
  EXPECT_NE(c.find("% of copy bandwidth (4248 GB/s)"), std::string::npos);
  EXPECT_NE(c.find("% of bf16 rate (783 TFLOP/s)"), std::string::npos);
  EXPECT_NE(c.find(">ceiling</text>"), std::string::npos);
  // Linear times span 11x: a linear axis.
  EXPECT_EQ(bench::render_svg(plots[2].figure).find("log scale"), std::string::npos);
}

// ---- the index and the command ----

TEST(ReportIndex, WritesPlotsAndTables) {
  std::vector<bench::ResultFile> files;
  for (const char* name : kEvalFixtures) files.push_back(bench::load_result(fixture(name)));
  for (const char* name : {"kernels_rms_norm_vs_candidate.json", "kernels_h200_subset.json"})
    files.push_back(bench::load_result(fixture(name)));
  const fs::path dir = kbn::test::temp_dir("kbn_report_test") / "out";
  bench::ReportOptions o;
  o.out_dir = dir.string();
  o.title = "Run <42> & more";
  const auto written = bench::write_report(files, o);
  ASSERT_EQ(written.size(), 5u + 2u + 4u + 2u);
  EXPECT_EQ(written[written.size() - 2], (dir / "index.md").string());
  EXPECT_EQ(written.back(), (dir / "index.html").string());
  const std::string md = read((dir / "index.md").string());
  const std::string html = read((dir / "index.html").string());
  EXPECT_EQ(xml_problem(html), "");
  EXPECT_NE(html.find("<title>Run &lt;42&gt; &amp; more</title>"), std::string::npos);
  EXPECT_EQ(md.rfind("# Run <42> & more\n", 0), 0u);
  for (const auto& path : written) {
    ASSERT_TRUE(fs::exists(path)) << path;
    const std::string name = fs::path(path).filename().string();
    if (name.rfind("index", 0) == 0) continue;
    EXPECT_EQ(xml_problem(read(path)), "") << path;
    EXPECT_NE(md.find("](" + name + ")"), std::string::npos) << name;
    EXPECT_NE(html.find("<img src=\"" + name + "\""), std::string::npos) << name;
  }
  // Key numbers: throughput per variant and the ratio row, alignment, kernel verdicts and speedups.
  EXPECT_NE(md.find("| decode-heavy | candidate/baseline |"), std::string::npos) << md;
  EXPECT_NE(md.find("| decode-heavy | 8 | 5 | 62.5% | 35.0 | 67.0% | 2 | 3 of 3 | 0.00664 / 0.0276 | 66.7% |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| balanced | 8 | 8 | 100.0% | 25.4 | 100.0% | 20 | - | - | - |"), std::string::npos) << md;
  EXPECT_NE(md.find("| latency-b1 | baseline | 4 |"), std::string::npos) << md;
  EXPECT_NE(md.find("## Kernels: rms_norm  tiny-llama  tp=1"), std::string::npos) << md;
  EXPECT_NE(md.find("2 of 4 cases pass, 2 fail; geometric-mean speedup over passing cases"), std::string::npos) << md;
  EXPECT_NE(md.find("| T=16384 H=4096 | - | 74.27 | 85.1 | 0.5 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| random#0 T=9 H=338 | FAIL | - | - | - | tolerance: "), std::string::npos) << md;
  fs::remove_all(dir.parent_path());
}

TEST(ReportIndex, SameGroupInTwoFilesDoesNotOverwrite) {
  const auto f = bench::load_result(fixture("kernels_rms_norm_baseline.json"));
  const fs::path dir = kbn::test::temp_dir("kbn_report_test");
  bench::ReportOptions o;
  o.out_dir = dir.string();
  const auto written = bench::write_report({f, f}, o);
  EXPECT_EQ(written[0], (dir / "kernels_rms_norm_tiny-llama_tp1_time.svg").string());
  EXPECT_EQ(written[1], (dir / "kernels_rms_norm_tiny-llama_tp1_time_2.svg").string());
  fs::remove_all(dir);
}

TEST(ReportCli, EndToEnd) {
  const std::string exe = kbn::test::kb_nano();
  if (exe.empty()) GTEST_SKIP() << "kb_nano is not built next to the test binary";
  const fs::path dir = kbn::test::temp_dir("kbn_report_test");
  std::string cmd = exe + " report";
  for (const char* name :
       {"eval_balanced_vs_candidate.json", "eval_latency-b1_baseline.json", "kernels_rms_norm_vs_candidate.json"})
    cmd += " " + fixture(name);
  const kbn::test::ShellResult r = kbn::test::shell(cmd + " --out " + (dir / "r").string() + " --title 'CPU <run>'");
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<std::string> lines;
  std::stringstream ss(r.output);
  for (std::string l; std::getline(ss, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 4u + 2u + 2u) << r.output;
  for (const auto& l : lines) EXPECT_TRUE(fs::exists(l)) << l;
  EXPECT_EQ(lines.front(), (dir / "r" / "eval_throughput.svg").string());
  EXPECT_NE(read((dir / "r" / "index.html").string()).find("<h1>CPU &lt;run&gt;</h1>"), std::string::npos);
  fs::remove_all(dir);
}

TEST(ReportCli, RefusalsNameTheFile) {
  const std::string exe = kbn::test::kb_nano();
  if (exe.empty()) GTEST_SKIP() << "kb_nano is not built next to the test binary";
  const fs::path dir = kbn::test::temp_dir("kbn_report_test");
  const std::string config = kbn::test::fixture_dir() + "/tiny-llama/config.json";
  kbn::test::ShellResult r = kbn::test::shell(exe + " report " + fixture("eval_balanced_vs_candidate.json") + " " +
                                              config + " --out " + (dir / "r").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("kb_nano: error: " + config + ": not a kb_nano eval or kernels result"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir / "r")) << "nothing is written when a file is refused";

  r = kbn::test::shell(exe + " report /nonexistent/k.json --out " + (dir / "r").string());
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("kb_nano: error: /nonexistent/k.json: cannot read (No such file or directory)"),
            std::string::npos)
      << r.output;

  r = kbn::test::shell(exe + " report");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("kb_nano report: missing the files to read"), std::string::npos) << r.output;
  fs::remove_all(dir);
}

// ---- merged kernels files (a top-level 'runs' array, as bench/results/h200/ holds) ----

TEST(ReportParse, MergedKernelsFileGivesOneResultPerRun) {
  const nlohmann::json one = nlohmann::json::parse(read(fixture("kernels_rms_norm_baseline.json")));
  nlohmann::json a = one, b = one;
  a["file"] = "kernels_a.json";
  const std::string text = nlohmann::json{{"runs", {a, b}}}.dump();
  const auto results = bench::parse_results(text, "merged.json");
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].path, "merged.json runs[0] (kernels_a.json)");
  EXPECT_EQ(results[1].path, "merged.json runs[1]");
  for (const auto& r : results) {
    EXPECT_EQ(r.kind, bench::ResultKind::kernels);
    EXPECT_EQ(r.kernels.rows.size(), one["rows"].size());
  }
  // A single result is one file, as before; a run that is no kernels result is named.
  EXPECT_EQ(bench::parse_results(one.dump(), "k.json").size(), 1u);
  const std::string bad = nlohmann::json{{"runs", {a, {{"summary", nlohmann::json::object()}}}}}.dump();
  const std::string err = kbn::test::error_of([&] { bench::parse_results(bad, "m.json"); });
  EXPECT_NE(err.find("m.json: key 'runs[1]' is not a kb_nano kernels result (no 'rows' array)"), std::string::npos)
      << err;
}

TEST(ReportCli, ReadsTheCommittedMergedKernelsFile) {
  const std::string exe = kbn::test::kb_nano();
  if (exe.empty()) GTEST_SKIP() << "kb_nano is not built next to the test binary";
  const fs::path dir = kbn::test::temp_dir("kbn_report_test");
  const std::string merged = KBN_SOURCE_DIR "/bench/results/h200/kernels_llama-3.1-8b_tp1_cold.json";
  const kbn::test::ShellResult r = kbn::test::shell(exe + " report " + merged + " --out " + (dir / "r").string());
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string index = read((dir / "r" / "index.md").string());
  for (const char* run : {"runs[0] (kernels_8b_argmax.json)", "(kernels_8b_linear.json)"})
    EXPECT_NE(index.find(run), std::string::npos) << run;
  EXPECT_TRUE(fs::exists(dir / "r" / "kernels_linear_llama-3.1-8b-instruct_tp1_time.svg"));
  fs::remove_all(dir);
}

// ---- eval --kernel-trace in the report ----

TEST(ReportKernelTrace, ParsesPlotsAndTablesTheGpuTimePerOp) {
  const auto f = bench::load_result(fixture("eval_balanced_kernel_trace_h200.json"));
  ASSERT_EQ(f.kind, bench::ResultKind::eval);
  const bench::EvalVariant* b = f.eval.find("baseline");
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(b->has_kernel_trace);
  EXPECT_NEAR(b->trace_wall_s, 41.098, 1e-3);
  EXPECT_NEAR(b->trace_busy_s, 39.6085, 1e-3);
  ASSERT_EQ(b->op_seconds.size(), 10u);
  EXPECT_EQ(b->op_seconds[0].first, "linear");
  EXPECT_NEAR(b->op_seconds[0].second, 22.330, 1e-3);
  EXPECT_EQ(b->op_seconds[1].first, "flash_attn_decode");
  // Files without a trace have none.
  EXPECT_FALSE(bench::load_result(fixture("eval_latency-b1_baseline.json")).eval.variants[0].has_kernel_trace);

  const auto plots = bench::eval_plots({&f});
  const std::string svg = bench::render_svg(find_plot(plots, "eval_kernel_time_balanced.svg").figure);
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "class=\"bar\""), 11u);  // 10 ops + GPU idle
  EXPECT_NE(svg.find("<title>baseline, GPU idle: 1.49</title>"), std::string::npos);
  EXPECT_NE(svg.find("<title>baseline, linear: 22.3</title>"), std::string::npos);

  const fs::path dir = kbn::test::temp_dir("kbn_report_trace_test") / "out";
  bench::ReportOptions o;
  o.out_dir = dir.string();
  bench::write_report({f}, o);
  const std::string md = read((dir / "index.md").string());
  EXPECT_NE(md.find("| balanced | baseline | linear | 22.330 | 56.4% |"), std::string::npos) << md;
  EXPECT_NE(md.find("| balanced | baseline | GPU idle (no kernel running) | 1.490 | of 41.098 s wall |"),
            std::string::npos)
      << md;
  fs::remove_all(dir.parent_path());
}

// Traces with the attributed time (each op's share of the busy time, overlaps counted once): a bar series per variant
// and two table columns; files without it keep '-' there and no such bars (above).
TEST(ReportKernelTrace, ShowsTheAttributedTimeWhereTheFileHasIt) {
  auto j = nlohmann::json::parse(read(fixture("eval_balanced_kernel_trace_h200.json")));
  auto& ops = j["results"]["baseline"]["kernel_trace"]["by_op"];
  double total = 0;
  for (auto& op : ops) total += op["seconds"].get<double>();
  for (auto& op : ops) op["attributed_s"] = op["seconds"].get<double>() * 39.6085 / total;  // sums to the busy time
  ops[0]["attributed_s"] = 20.5;
  const auto f = bench::parse_result(j.dump(), "attributed.json");
  const bench::EvalVariant* b = f.eval.find("baseline");
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(b->op_attributed_s.size(), b->op_seconds.size());
  EXPECT_EQ(b->op_attributed_s[0].first, "linear");
  EXPECT_DOUBLE_EQ(b->op_attributed_s[0].second, 20.5);
  const auto plots = bench::eval_plots({&f});
  const std::string svg = bench::render_svg(find_plot(plots, "eval_kernel_time_balanced.svg").figure);
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(count(svg, "class=\"bar\""), 21u);  // 10 ops + GPU idle, then 10 attributed
  EXPECT_NE(svg.find("<title>attributed, baseline, linear: 20.5</title>"), std::string::npos);

  const fs::path dir = kbn::test::temp_dir("kbn_report_attributed_test") / "out";
  bench::ReportOptions o;
  o.out_dir = dir.string();
  bench::write_report({f}, o);
  const std::string md = read((dir / "index.md").string());
  EXPECT_NE(md.find("| balanced | baseline | linear | 22.330 | 56.4% | 20.500 |"), std::string::npos) << md;
  fs::remove_all(dir.parent_path());
}

TEST(ReportSerialFloor, ParsesPlotsAndTablesTheFloorAndItsShareByOp) {
  // The H200 kernel-trace file with a serial floor added: synthetic figures, chosen to be easy to find in the output.
  auto j = nlohmann::json::parse(read(fixture("eval_balanced_kernel_trace_h200.json")));
  j["results"]["baseline"]["serial_floor"] = {{"available", true},
                                              {"floor_s", 30.5},
                                              {"achieved_fraction", 30.5 / 41.097864615999995},
                                              {"gemm_s", 18.25},
                                              {"kv_read_s", 12.0},
                                              {"attention_flops_s", 0.25},
                                              {"by_op",
                                               {{{"op", "linear"}, {"floor_s", 18.125}},
                                                {{"op", "embedding"}, {"floor_s", 0.125}},
                                                {{"op", "flash_attn_decode"}, {"floor_s", 11.5}},
                                                {{"op", "flash_attn_prefill"}, {"floor_s", 0.75}}}}};
  const auto f = bench::parse_result(j.dump(), "floor.json");
  const bench::EvalVariant* b = f.eval.find("baseline");
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(b->has_serial_floor);
  EXPECT_DOUBLE_EQ(b->floor_s, 30.5);
  EXPECT_DOUBLE_EQ(b->floor_gemm_s, 18.25);
  EXPECT_NEAR(b->floor_achieved, 0.7421, 1e-4);
  ASSERT_EQ(b->op_floor_s.size(), 4u);
  EXPECT_EQ(b->op_floor_s[2].first, "flash_attn_decode");

  const auto plots = bench::eval_plots({&f});
  const std::string floor_svg = bench::render_svg(find_plot(plots, "eval_serial_floor.svg").figure);
  EXPECT_EQ(xml_problem(floor_svg), "");
  EXPECT_EQ(count(floor_svg, "class=\"bar\""), 3u);  // achieved; measured and floor seconds
  EXPECT_NE(floor_svg.find(">74.2%</text>"), std::string::npos);
  EXPECT_NE(floor_svg.find(">30.5</text>"), std::string::npos);
  // The kernel-time plot gains a bar per op the floor counts (4) beside the 10 ops and the idle time.
  const std::string trace_svg = bench::render_svg(find_plot(plots, "eval_kernel_time_balanced.svg").figure);
  EXPECT_EQ(count(trace_svg, "class=\"bar\""), 15u);
  EXPECT_NE(trace_svg.find("<title>serial floor, baseline, flash_attn_decode: 11.5</title>"), std::string::npos);

  const fs::path dir = kbn::test::temp_dir("kbn_report_floor_test") / "out";
  bench::ReportOptions o;
  o.out_dir = dir.string();
  bench::write_report({f}, o);
  const std::string md = read((dir / "index.md").string());
  EXPECT_NE(md.find("| balanced | baseline | 41.098 | 30.500 | 18.250 | 12.000 | 0.250 | 74.2% |"), std::string::npos)
      << md;
  EXPECT_NE(md.find("| balanced | baseline | flash_attn_decode | 11.500 | 14.555 | 79.0% |"), std::string::npos) << md;
  fs::remove_all(dir.parent_path());

  // Where eval wrote the seconds of the ops doing a floor op's work (serial_floor.by_op[].kernel_s: linear's with
  // rms_norm_gemv's folded projections), the table compares the floor with those, not with the op's own row.
  j["results"]["baseline"]["serial_floor"]["by_op"][0]["kernel_s"] = 29.0;
  j["results"]["baseline"]["serial_floor"]["by_op"][0]["kernel_ops"] = {"linear", "rms_norm_gemv"};
  const auto fk = bench::parse_result(j.dump(), "floor_kernel_s.json");
  ASSERT_EQ(fk.eval.find("baseline")->op_floor_kernel_s.size(), 1u);
  const fs::path kdir = kbn::test::temp_dir("kbn_report_floor_kernel_s_test") / "out";
  o.out_dir = kdir.string();
  bench::write_report({fk}, o);
  const std::string kmd = read((kdir / "index.md").string());
  EXPECT_NE(kmd.find("| balanced | baseline | linear | 18.125 | 29.000 | 62.5% |"), std::string::npos) << kmd;
  EXPECT_NE(kmd.find("| balanced | baseline | flash_attn_decode | 11.500 | 14.555 | 79.0% |"), std::string::npos)
      << kmd;
  fs::remove_all(kdir.parent_path());

  // A CPU run says there is no floor, and the index says why; files from before the floor have none.
  auto cpu = nlohmann::json::parse(read(fixture("eval_latency-b1_baseline.json")));
  cpu["results"]["baseline"]["serial_floor"] = {{"available", false}, {"reason", "CPU run: no GPU rates"}};
  const auto c = bench::parse_result(cpu.dump(), "cpu.json");
  EXPECT_FALSE(c.eval.variants[0].has_serial_floor);
  EXPECT_EQ(c.eval.variants[0].no_floor_reason, "CPU run: no GPU rates");
  EXPECT_EQ(names(bench::eval_plots({&c})),
            (std::vector<std::string>{"eval_throughput.svg", "eval_latency_latency-b1.svg"}));
  const fs::path cdir = kbn::test::temp_dir("kbn_report_floor_cpu_test") / "out";
  o.out_dir = cdir.string();
  bench::write_report({c}, o);
  EXPECT_NE(read((cdir / "index.md").string()).find("n/a: CPU run: no GPU rates"), std::string::npos);
  fs::remove_all(cdir.parent_path());

  // A floor without its parts names the key.
  j["results"]["baseline"]["serial_floor"].erase("kv_read_s");
  EXPECT_EQ(error_of([&] { bench::parse_result(j.dump(), "floor.json"); }),
            "floor.json: missing key 'results.baseline.serial_floor.kv_read_s'");
}
