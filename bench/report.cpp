// `kb_nano report`: result files to SVG plots and an index (see report.h).
#include "bench/report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>
#include <set>
#include <sstream>

#include "kbn/error.h"
#include "kbn/format.h"

namespace kbn::bench {
namespace {

using json = nlohmann::json;

// At least three significant digits and no exponent, for the magnitudes results have (tokens/s, ms, %, x).
std::string short_number(double v) {
  if (!std::isfinite(v)) return "-";
  const double a = std::fabs(v);
  if (a >= 100) return fmt("%.0f", v);
  if (a >= 10) return fmt("%.1f", v);
  if (a >= 1) return fmt("%.2f", v);
  if (a == 0) return "0";
  return fmt("%.3g", v);
}

// ---- 1. result files ----

// A value inside a parsed file with its path from the root ("results.baseline.ttft_s"), so that every
// refusal names the file and the exact key.
class Node {
 public:
  Node(const json& j, std::string path, const std::string& file) : j_(&j), path_(std::move(path)), file_(&file) {}

  [[noreturn]] void fail(const std::string& what) const { KBN_FAIL(*file_, ": ", what); }

  bool has(const char* key) const { return j_->is_object() && j_->contains(key); }

  Node operator[](const char* key) const {
    const std::string path = path_.empty() ? key : path_ + "." + key;
    if (!j_->is_object()) fail("key '" + path_ + "' should be an object, got " + j_->type_name());
    const auto it = j_->find(key);
    if (it == j_->end()) fail("missing key '" + path + "'");
    return Node(*it, path, *file_);
  }

  Node operator[](size_t i) const { return Node((*j_)[i], path_ + "[" + std::to_string(i) + "]", *file_); }

  size_t size() const {
    if (!j_->is_array()) fail("key '" + path_ + "' should be an array, got " + j_->type_name());
    return j_->size();
  }

  // JSON has no NaN: nlohmann writes a NaN as null, so null reads back as "no value".
  double number() const {
    if (j_->is_null()) return kNoValue;
    if (!j_->is_number()) fail("key '" + path_ + "' should be a number, got " + j_->type_name());
    return j_->get<double>();
  }

  int64_t integer() const {
    if (!j_->is_number_integer()) fail("key '" + path_ + "' should be an integer, got " + j_->type_name());
    return j_->get<int64_t>();
  }

  bool boolean() const {
    if (!j_->is_boolean()) fail("key '" + path_ + "' should be true or false, got " + j_->type_name());
    return j_->get<bool>();
  }

  std::string str() const {
    if (!j_->is_string()) fail("key '" + path_ + "' should be a string, got " + j_->type_name());
    return j_->get<std::string>();
  }

  std::string str_or(const char* key, const std::string& otherwise) const {
    return has(key) ? (*this)[key].str() : otherwise;
  }

  const json& raw() const { return *j_; }

 private:
  const json* j_;
  std::string path_;
  const std::string* file_;
};

Percentiles parse_percentiles(const Node& n) {
  Percentiles p;
  p.count = n["count"].integer();
  p.mean = n["mean"].number();
  p.p50 = n["p50"].number();
  p.p90 = n["p90"].number();
  p.p99 = n["p99"].number();
  return p;
}

EvalVariant parse_eval_variant(const Node& n, const std::string& name) {
  EvalVariant v;
  v.name = name;
  v.num_requests = n["num_requests"].integer();
  v.prompt_tokens = n["prompt_tokens"].integer();
  v.output_tokens = n["output_tokens"].integer();
  v.duration_s = n["duration_s"].number();
  v.output_tokens_per_s = n["output_tokens_per_s"].number();
  v.total_tokens_per_s = n["total_tokens_per_s"].number();
  v.requests_per_s = n["requests_per_s"].number();
  v.ttft_s = parse_percentiles(n["ttft_s"]);
  v.tpot_s = parse_percentiles(n["tpot_s"]);
  v.itl_s = parse_percentiles(n["itl_s"]);
  v.e2e_s = parse_percentiles(n["e2e_latency_s"]);
  if (n.has("kernel_trace")) {
    const Node t = n["kernel_trace"];
    v.has_kernel_trace = true;
    v.trace_wall_s = t["wall_s"].number();
    v.trace_kernel_s = t["kernel_s"].number();
    const Node busy = t["busy_s"];
    if (!busy.raw().is_object()) busy.fail("key 'kernel_trace.busy_s' should be an object of device: seconds");
    for (const auto& item : busy.raw().items())
      v.trace_busy_s = std::max(v.trace_busy_s, busy[item.key().c_str()].number());
    const Node ops = t["by_op"];
    for (size_t i = 0; i < ops.size(); ++i) v.op_seconds.push_back({ops[i]["name"].str(), ops[i]["seconds"].number()});
    for (size_t i = 0; i < ops.size() && ops[size_t(0)].has("attributed_s"); ++i)
      v.op_attributed_s.push_back({ops[i]["name"].str(), ops[i]["attributed_s"].number()});
  }
  if (n.has("serial_floor")) {
    const Node f = n["serial_floor"];
    if (f["available"].boolean()) {
      v.has_serial_floor = true;
      v.floor_s = f["floor_s"].number();
      v.floor_gemm_s = f["gemm_s"].number();
      v.floor_kv_read_s = f["kv_read_s"].number();
      v.floor_attention_flops_s = f["attention_flops_s"].number();
      v.floor_achieved = f["achieved_fraction"].number();
      const Node ops = f["by_op"];
      for (size_t i = 0; i < ops.size(); ++i) {
        v.op_floor_s.push_back({ops[i]["op"].str(), ops[i]["floor_s"].number()});
        if (ops[i].has("kernel_s")) v.op_floor_kernel_s.push_back({ops[i]["op"].str(), ops[i]["kernel_s"].number()});
      }
    } else {
      v.no_floor_reason = f["reason"].str();
    }
  }
  return v;
}

// Eval files name the device twice ("cuda:0" and "NVIDIA H200"), kernels files once in an object.
std::string device_of(const Node& prov) {
  if (!prov.has("device")) return prov.str_or("device_name", "");
  const Node d = prov["device"];
  const std::string name = d.raw().is_object() ? d.str_or("name", "") : d.str();
  const std::string detail = prov.str_or("device_name", "");
  return detail.empty() || detail == name ? name : name + " (" + detail + ")";
}

EvalResult parse_eval(const Node& root) {
  EvalResult r;
  const Node config = root["config"];
  r.workload = config["workload"].str();
  r.model = config["model"].str();
  r.mode = config.str_or("mode", "");
  if (root.has("provenance")) {
    const Node p = root["provenance"];
    r.device = device_of(p);
    r.commit = p.str_or("commit", "");
    r.date = p.str_or("date", "");
  }
  const Node results = root["results"];
  for (const char* name : {"baseline", "candidate"})
    if (results.has(name)) r.variants.push_back(parse_eval_variant(results[name], name));
  if (root.has("alignment")) {
    const Node a = root["alignment"];
    r.has_alignment = true;
    r.alignment.requests = a["requests"].integer();
    r.alignment.exact_match = a["exact_match"].integer();
    r.alignment.exact_match_rate = a["exact_match_rate"].number();
    r.alignment.mean_matching_prefix = a["mean_matching_prefix"].number();
    r.alignment.mean_matching_prefix_fraction = a["mean_matching_prefix_fraction"].number();
    r.alignment.min_matching_prefix = a["min_matching_prefix"].integer();
    if (a.has("divergences")) {
      const Node d = a["divergences"];
      r.alignment.has_divergences = true;
      r.alignment.diverged = d["diverged"].integer();
      r.alignment.scored = d["scored"].integer();
      r.alignment.median_margin_over_std = d["median_margin_over_std"].number();
      r.alignment.max_margin_over_std = d["max_margin_over_std"].number();
      r.alignment.rank2_fraction = d["rank2_fraction"].number();
    }
  }
  return r;
}

KernelTiming parse_timing(const Node& n) {
  KernelTiming t;
  t.timed = n["timed"].boolean();
  if (t.timed) t.median_ms = n["median_ms"].number();
  return t;
}

KernelsResult parse_kernels(const Node& root) {
  KernelsResult r;
  if (root.has("provenance")) {
    const Node p = root["provenance"];
    r.device = device_of(p);
    r.commit = p.str_or("commit", "");
    r.date = p.str_or("date", "");
    r.mode = p.str_or("mode", "");
    if (p.has("ceilings")) {
      r.copy_gb_per_s = p["ceilings"]["copy_gb_per_s"].number();
      r.bf16_tflop_per_s = p["ceilings"]["bf16_tflop_per_s"].number();
    }
  }
  const Node rows = root["rows"];
  if (rows.size() == 0) root.fail("key 'rows' is empty: the run recorded no case, so there is nothing to plot");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Node row = rows[i];
    KernelRow k;
    k.op = row["op"].str();
    k.model = row["model"].str();
    k.tp = row["tp"].integer();
    k.label = row["case"].str();
    if (row.has("tokens")) k.tokens = row["tokens"].integer();
    // Results written before the validation contract (bench/results/h200/) call the verdict 'check' and
    // put the baseline's timing on the row itself.
    k.verdict = !row.has("verdict") && row.has("check") ? row["check"].str() : row["verdict"].str();
    k.reason = row.str_or("reason", "");
    k.baseline = parse_timing(row.has("baseline") || !row.has("timed") ? row["baseline"] : row);
    if (row.has("candidate")) {
      k.candidate = parse_timing(row["candidate"]);
      r.compare = true;
    }
    if (row.has("speedup")) k.speedup = row["speedup"].number();
    if (row.has("pct_copy_bandwidth")) k.pct_copy = row["pct_copy_bandwidth"].number();
    if (row.has("pct_bf16_rate")) k.pct_bf16 = row["pct_bf16_rate"].number();
    r.rows.push_back(std::move(k));
  }
  return r;
}

}  // namespace

const EvalVariant* EvalResult::find(std::string_view variant) const {
  for (const auto& v : variants)
    if (v.name == variant) return &v;
  return nullptr;
}

ResultFile parse_result(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    KBN_FAIL(path, ": not valid JSON (", e.what(), ")");
  }
  const Node root(j, "", path);
  ResultFile f;
  f.path = path;
  const bool eval = j.is_object() && j.contains("results") && j["results"].is_object() &&
                    (j["results"].contains("baseline") || j["results"].contains("candidate"));
  const bool kernels = j.is_object() && j.contains("rows") && j["rows"].is_array();
  if (eval) {
    f.kind = ResultKind::eval;
    f.eval = parse_eval(root);
  } else if (kernels) {
    f.kind = ResultKind::kernels;
    f.kernels = parse_kernels(root);
  } else {
    std::string found;
    if (j.is_object()) {
      for (const auto& [key, value] : j.items()) found += (found.empty() ? "" : ", ") + key;
      found = "its top-level keys are: " + (found.empty() ? std::string("(none)") : found);
    } else {
      found = std::string("its top level is ") + j.type_name() + ", not an object";
    }
    root.fail(
        "not a kb_nano eval or kernels result: expected 'results' with 'baseline' or 'candidate' (kb_nano eval "
        "--json) or a 'rows' array (kb_nano kernels --json); " +
        found);
  }
  return f;
}

namespace {

std::string read_result_text(const std::string& path) {
  // An ifstream opens a folder without complaint on Linux; only the read would fail, without a reason.
  KBN_CHECK(!std::filesystem::is_directory(path), path, ": is a folder, not a result file");
  std::ifstream in(path, std::ios::binary);
  KBN_CHECK(in.good(), path, ": cannot read (", std::strerror(errno), ")");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

ResultFile load_result(const std::string& path) { return parse_result(read_result_text(path), path); }

std::vector<ResultFile> parse_results(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    KBN_FAIL(path, ": not valid JSON (", e.what(), ")");
  }
  if (!(j.is_object() && j.contains("runs") && !j.contains("rows") && !j.contains("results")))
    return {parse_result(text, path)};
  const Node runs = Node(j, "", path)["runs"];
  if (runs.size() == 0) runs.fail("key 'runs' is empty: the merged file holds no kernels run, so there is nothing to plot");
  std::vector<ResultFile> out;
  for (size_t i = 0; i < runs.size(); ++i) {
    const json& run = j["runs"][i];
    const std::string name = path + " runs[" + std::to_string(i) + "]" +
                             (run.is_object() && run.contains("file") && run["file"].is_string()
                                  ? " (" + run["file"].get<std::string>() + ")"
                                  : std::string());
    if (!(run.is_object() && run.contains("rows")))
      runs[i].fail("key 'runs[" + std::to_string(i) + "]' is not a kb_nano kernels result (no 'rows' array)");
    ResultFile f;
    f.path = name;
    f.kind = ResultKind::kernels;
    f.kernels = parse_kernels(runs[i]);
    out.push_back(std::move(f));
  }
  return out;
}

std::vector<ResultFile> load_results(const std::string& path) { return parse_results(read_result_text(path), path); }

// ---- 2. SVG charts ----

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (static_cast<unsigned char>(ch) >= 0x20 || ch == '\t' || ch == '\n') out += ch;
    }
  }
  return out;
}

namespace {

// NOTE: SVG has no text measurement without a renderer; 0.6 em per character over-estimates the average
// sans-serif advance, so labels get room rather than overlap.
double text_width(const std::string& s, double font_px) { return double(s.size()) * font_px * 0.6; }

std::string px(double v) { return fmt("%.1f", v); }

constexpr double kPlotHeight = 220;
constexpr double kGroupGap = 16;
constexpr double kTitleFont = 13, kLabelFont = 11, kValueFont = 10;
constexpr double kLabelAngle = 40;  // degrees the category labels turn when they do not fit flat
const char* const kInk = "#333333";
const char* const kGrey = "#888888";

struct Axis {
  bool log = false;
  double lo = 0, hi = 1;
  std::vector<double> ticks;
  // 0 at the bottom of the plot, 1 at the top.
  double frac(double v) const {
    if (log) return (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
    return (v - lo) / (hi - lo);
  }
  bool drawable(double v) const { return std::isfinite(v) && (!log || v > 0); }
};

// 1, 2 or 5 times a power of ten, at least x.
double nice_step(double x) {
  const double e = std::pow(10.0, std::floor(std::log10(x)));
  const double f = x / e;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * e;
}

// `headroom` is the share of the plot height kept free above the tallest bar for its value label.
Axis make_axis(const std::vector<double>& values, bool log, double headroom) {
  Axis a;
  double lo_v = INFINITY, hi_v = 0;
  for (double v : values)
    if (std::isfinite(v) && v > 0) lo_v = std::min(lo_v, v), hi_v = std::max(hi_v, v);
  if (log && hi_v > 0) {
    a.log = true;
    const double lo_e = std::floor(std::log10(lo_v));
    const double top = lo_e + (std::log10(hi_v) - lo_e) / (1 - headroom);
    const double hi_e = std::max(std::ceil(top - 1e-9), lo_e + 1);
    a.lo = std::pow(10.0, lo_e);
    a.hi = std::pow(10.0, hi_e);
    for (double e = lo_e; e <= hi_e + 0.5; e += 1) a.ticks.push_back(std::pow(10.0, e));
    return a;
  }
  const double target = (hi_v > 0 ? hi_v : 1.0) / (1 - headroom);
  const double step = nice_step(target / 5);
  const int n = int(std::ceil(target / step - 1e-9));
  a.hi = step * n;
  for (int i = 0; i <= n; ++i) a.ticks.push_back(step * i);
  return a;
}

std::string tick_label(double v) {
  return fmt(std::fabs(v) >= 1e6 || (v != 0 && std::fabs(v) < 1e-3) ? "%.0e" : "%.6g", v);
}

std::string value_label(const BarPanel& p, double v) { return short_number(v) + p.value_suffix; }

std::vector<LegendEntry> legend_of(const BarPanel& p) {
  if (!p.legend.empty()) return p.legend;
  std::vector<LegendEntry> out;
  if (p.series.size() > 1)
    for (const auto& s : p.series) out.push_back({s.name, s.colour, false});
  return out;
}

// Where everything of a panel goes, relative to the panel's top-left corner.
struct PanelLayout {
  Axis axis;
  double bar_w = 0, group_w = 0;
  double plot_x = 0, plot_y = 0, plot_w = 0;
  double width = 0, height = 0;
  bool rotate_values = false, rotate_categories = false;
};

PanelLayout layout(const BarPanel& p) {
  PanelLayout l;
  const size_t n_series = std::max<size_t>(p.series.size(), 1);
  const size_t n_cat = std::max<size_t>(p.categories.size(), 1);
  double widest_value = 0;
  std::vector<double> values;
  for (const auto& s : p.series)
    for (double v : s.values)
      if (std::isfinite(v)) {
        values.push_back(v);
        widest_value = std::max(widest_value, text_width(value_label(p, v), kValueFont));
      }
  if (p.has_reference) values.push_back(p.reference);
  // Bars widen to carry their value label flat, up to a point; past it the labels turn upright.
  l.bar_w = std::clamp(widest_value + 4, n_series == 1 ? 30.0 : 22.0, 44.0);
  l.rotate_values = widest_value > l.bar_w;
  const double value_room = l.rotate_values ? widest_value + 8 : kValueFont + 6;
  l.axis = make_axis(values, p.log_scale, std::min(0.6, value_room / kPlotHeight));

  double widest_tick = 0;
  for (double t : l.axis.ticks) widest_tick = std::max(widest_tick, text_width(tick_label(t), kValueFont));
  l.plot_x = 24 + widest_tick + 8;
  l.plot_y = legend_of(p).empty() ? 32 : 52;
  l.group_w = double(n_series) * l.bar_w + kGroupGap;
  l.plot_w = std::max(double(n_cat) * l.group_w, 180.0);
  l.group_w = l.plot_w / double(n_cat);
  double widest_category = 0;
  for (const auto& c : p.categories) widest_category = std::max(widest_category, text_width(c, kLabelFont));
  l.rotate_categories = widest_category > l.group_w - 4;
  const double rad = kLabelAngle * std::numbers::pi / 180;
  // A turned label ends left of its column: the first one must not leave the panel.
  if (l.rotate_categories && !p.categories.empty())
    l.plot_x = std::max(l.plot_x, text_width(p.categories[0], kLabelFont) * std::cos(rad) - l.group_w / 2 + 8);
  const double below = l.rotate_categories ? widest_category * std::sin(rad) + kLabelFont * std::cos(rad) + 16 : 24;
  const double right = 16 + (p.has_reference ? text_width(p.reference_label, kValueFont) + 6 : 0);
  double legend_w = 0;
  for (const auto& e : legend_of(p)) legend_w += 30 + text_width(e.label, kLabelFont);
  l.width =
      std::max({l.plot_x + l.plot_w + right, l.plot_x + legend_w, l.plot_x + text_width(p.title, kTitleFont) + 16});
  l.height = l.plot_y + kPlotHeight + below;
  return l;
}

void text(std::string& out, double x, double y, const std::string& s, const char* cls, double size,
          const char* anchor = "start", const std::string& extra = "") {
  out += "<text class=\"" + std::string(cls) + "\" x=\"" + px(x) + "\" y=\"" + px(y) + "\" font-size=\"" + px(size) +
         "\" text-anchor=\"" + anchor + "\"" + extra + ">" + xml_escape(s) + "</text>\n";
}

// Text turned by `angle` degrees about its anchor point (x, y).
void turned_text(std::string& out, double x, double y, double angle, const std::string& s, const char* cls, double size,
                 const char* anchor, const std::string& fill = kInk, const std::string& extra = "") {
  out += "<text class=\"" + std::string(cls) + "\" transform=\"translate(" + px(x) + "," + px(y) + ") rotate(" +
         px(angle) + ")\" font-size=\"" + px(size) + "\" text-anchor=\"" + anchor + "\" fill=\"" + fill + "\"" + extra +
         ">" + xml_escape(s) + "</text>\n";
}

void line(std::string& out, double x1, double y1, double x2, double y2, const char* cls, const char* stroke,
          const std::string& extra = "") {
  out += "<line class=\"" + std::string(cls) + "\" x1=\"" + px(x1) + "\" y1=\"" + px(y1) + "\" x2=\"" + px(x2) +
         "\" y2=\"" + px(y2) + "\" stroke=\"" + stroke + "\"" + extra + "/>\n";
}

void draw_panel(std::string& out, const BarPanel& p, const PanelLayout& l, double x0, double y0) {
  out += "<g class=\"panel\" transform=\"translate(" + px(x0) + "," + px(y0) + ")\">\n";
  text(out, l.plot_x, 18, p.title, "panel-title", kTitleFont, "start", " font-weight=\"bold\"");

  double lx = l.plot_x;
  for (const auto& e : legend_of(p)) {
    out += "<g class=\"legend\">";
    if (e.line)
      line(out, lx, 33, lx + 16, 33, "legend-line", e.colour.c_str(), " stroke-width=\"1.5\" stroke-dasharray=\"5,3\"");
    else
      out += "<rect x=\"" + px(lx) + "\" y=\"28\" width=\"11\" height=\"11\" fill=\"" + e.colour + "\"/>";
    text(out, lx + 20, 38, e.label, "legend-label", kLabelFont);
    out += "</g>\n";
    lx += 30 + text_width(e.label, kLabelFont);
  }

  const double bottom = l.plot_y + kPlotHeight;
  auto y_of = [&](double v) { return bottom - kPlotHeight * std::clamp(l.axis.frac(v), 0.0, 1.0); };
  for (double t : l.axis.ticks) {
    const double y = y_of(t);
    line(out, l.plot_x, y, l.plot_x + l.plot_w, y, "grid", "#e6e6e6");
    line(out, l.plot_x - 4, y, l.plot_x, y, "tick", kInk);
    text(out, l.plot_x - 7, y + 3.5, tick_label(t), "tick-label", kValueFont, "end");
  }
  line(out, l.plot_x, l.plot_y, l.plot_x, bottom, "axis", kInk);
  line(out, l.plot_x, bottom, l.plot_x + l.plot_w, bottom, "axis", kInk);
  turned_text(out, 12, l.plot_y + kPlotHeight / 2, -90, p.y_label + (l.axis.log ? " (log scale)" : ""), "axis-label",
              kLabelFont, "middle");

  const size_t n_series = p.series.size();
  for (size_t c = 0; c < p.categories.size(); ++c) {
    const double group_x = l.plot_x + double(c) * l.group_w;
    const double first = group_x + (l.group_w - double(n_series) * l.bar_w) / 2;
    for (size_t s = 0; s < n_series; ++s) {
      const BarSeries& ser = p.series[s];
      const double v = c < ser.values.size() ? ser.values[c] : kNoValue;
      const double x = first + double(s) * l.bar_w;
      const double mid = x + (l.bar_w - 2) / 2;
      const bool own_colour = c < ser.colours.size() && !ser.colours[c].empty();
      if (!l.axis.drawable(v)) {
        // A missing bar's note takes the bar's own colour (a FAIL in red), else grey.
        const std::string note = c < ser.notes.size() ? ser.notes[c] : "";
        if (!note.empty())
          turned_text(out, mid + 3.5, bottom - 4, -90, note, "note", kValueFont, "start",
                      own_colour ? ser.colours[c] : kGrey);
        continue;
      }
      const double top = y_of(std::max(v, l.axis.log ? l.axis.lo : 0.0));
      const std::string colour = own_colour ? ser.colours[c] : ser.colour;
      const std::string label = value_label(p, v);
      out += "<rect class=\"bar\" x=\"" + px(x) + "\" y=\"" + px(top) + "\" width=\"" + px(l.bar_w - 2) +
             "\" height=\"" + px(bottom - top) + "\" fill=\"" + colour + "\"><title>" +
             xml_escape(ser.name + ", " + p.categories[c] + ": " + label) + "</title></rect>\n";
      // NOTE: a white outline keeps a value label legible where it crosses a grid or reference line.
      const std::string halo = " stroke=\"#ffffff\" stroke-width=\"3\" paint-order=\"stroke\"";
      if (l.rotate_values)
        turned_text(out, mid + 3.5, top - 4, -90, label, "value", kValueFont, "start", kInk, halo);
      else
        text(out, mid, top - 4, label, "value", kValueFont, "middle", halo);
    }
    const double cx = group_x + l.group_w / 2;
    if (l.rotate_categories)
      turned_text(out, cx, bottom + 12, -kLabelAngle, p.categories[c], "category", kLabelFont, "end");
    else
      text(out, cx, bottom + 16, p.categories[c], "category", kLabelFont, "middle");
  }

  if (p.has_reference && l.axis.drawable(p.reference)) {
    const double y = y_of(p.reference);
    line(out, l.plot_x, y, l.plot_x + l.plot_w, y, "reference", "#555555",
         " stroke-width=\"1.5\" stroke-dasharray=\"5,3\"");
    text(out, l.plot_x + l.plot_w + 4, y + 3.5, p.reference_label, "reference-label", kValueFont);
  }
  out += "</g>\n";
}

}  // namespace

std::string render_svg(const Figure& figure) {
  std::vector<PanelLayout> layouts;
  double cell_w = 0, cell_h = 0;
  for (const auto& p : figure.panels) {
    layouts.push_back(layout(p));
    cell_w = std::max(cell_w, layouts.back().width);
    cell_h = std::max(cell_h, layouts.back().height);
  }
  const size_t columns =
      std::clamp<size_t>(size_t(std::max(figure.columns, 1)), 1, std::max<size_t>(figure.panels.size(), 1));
  const size_t rows = (figure.panels.size() + columns - 1) / columns;
  constexpr double pad = 16;
  std::vector<std::string> subtitle;
  std::stringstream lines(figure.subtitle);
  for (std::string s; std::getline(lines, s);) subtitle.push_back(s);
  const double header = 40 + 18 * double(subtitle.size());
  double width = std::max(double(columns) * cell_w + 2 * pad, text_width(figure.title, 16) + 2 * pad);
  for (const auto& s : subtitle) width = std::max(width, text_width(s, 12) + 2 * pad);
  const double height = header + double(rows) * cell_h + pad;

  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + px(width) + "\" height=\"" + px(height) +
         "\" viewBox=\"0 0 " + px(width) + " " + px(height) +
         "\" font-family=\"Helvetica, Arial, sans-serif\" fill=\"" + kInk + "\">\n";
  out += "<title>" + xml_escape(figure.title) + "</title>\n";
  out += "<rect class=\"background\" x=\"0\" y=\"0\" width=\"" + px(width) + "\" height=\"" + px(height) +
         "\" fill=\"#ffffff\"/>\n";
  text(out, pad, 26, figure.title, "title", 16, "start", " font-weight=\"bold\"");
  for (size_t i = 0; i < subtitle.size(); ++i)
    text(out, pad, 46 + 18 * double(i), subtitle[i], "subtitle", 12, "start", " fill=\"#555555\"");
  for (size_t i = 0; i < figure.panels.size(); ++i)
    draw_panel(out, figure.panels[i], layouts[i], pad + double(i % columns) * cell_w,
               header + double(i / columns) * cell_h);
  out += "</svg>\n";
  return out;
}

// ---- 3. the report ----

namespace {

const char* const kBaselineColour = "#4e79a7";
const char* const kCandidateColour = "#f28e2b";
const char* const kPassColour = "#59a14f";
const char* const kFailColour = "#e15759";
const char* const kUncheckedColour = "#bab0ac";
const char* const kBf16Colour = "#b07aa1";

const char* variant_colour(const std::string& v) { return v == "candidate" ? kCandidateColour : kBaselineColour; }

std::string file_name(const std::string& path) { return std::filesystem::path(path).filename().string(); }

// Lower-case letters, digits, '-' and '.'; anything else becomes one '_'.
std::string slug(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    const char c = char(std::tolower(static_cast<unsigned char>(ch)));
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.')
      out += c;
    else if (out.empty() || out.back() != '_')
      out += '_';
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out.empty() ? "result" : out;
}

// The column label of each eval file: its workload, plus the file name when two files ran the same one (and a
// number when the same file is given twice).
// The workload's name; when several files ran it, their execution modes tell them apart ("balanced, graph"),
// and where that is not enough, the file's name without its extension.
std::vector<std::string> workload_labels(const std::vector<const ResultFile*>& files) {
  std::map<std::string, int> runs, runs_with_mode;
  for (const auto* f : files) {
    runs[f->eval.workload]++;
    runs_with_mode[f->eval.workload + "/" + f->eval.mode]++;
  }
  std::vector<std::string> out;
  std::map<std::string, int> seen;
  for (const auto* f : files) {
    std::string label = f->eval.workload;
    if (runs[label] > 1) {
      if (!f->eval.mode.empty()) label += ", " + f->eval.mode;
      if (f->eval.mode.empty() || runs_with_mode[f->eval.workload + "/" + f->eval.mode] > 1)
        label += " (" + std::filesystem::path(f->path).stem().string() + ")";
    }
    const int n = ++seen[label];
    out.push_back(n > 1 ? label + " #" + std::to_string(n) : label);
  }
  return out;
}

std::string joined_distinct(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  std::set<std::string> seen;
  for (const auto& s : items) {
    if (s.empty() || !seen.insert(s).second) continue;
    out += (out.empty() ? "" : sep) + s;
  }
  return out;
}

std::string eval_context(const std::vector<const ResultFile*>& files) {
  std::vector<std::string> parts;
  for (const auto* f : files) parts.push_back(f->eval.model + (f->eval.device.empty() ? "" : " on " + f->eval.device));
  return joined_distinct(parts, "; ");
}

std::vector<std::string> variants_in(const std::vector<const ResultFile*>& files) {
  std::vector<std::string> out;
  for (const char* name : {"baseline", "candidate"})
    for (const auto* f : files)
      if (f->eval.find(name)) {
        out.push_back(name);
        break;
      }
  return out;
}

// Columns = workloads, one series per variant; `pick` reads the number from a variant.
BarPanel workload_panel(const std::vector<const ResultFile*>& files, const std::string& title,
                        const std::string& y_label, double (*pick)(const EvalVariant&)) {
  BarPanel p;
  p.title = title;
  p.y_label = y_label;
  p.categories = workload_labels(files);
  for (const auto& name : variants_in(files)) {
    BarSeries s;
    s.name = name;
    s.colour = variant_colour(name);
    for (const auto* f : files) {
      const EvalVariant* v = f->eval.find(name);
      s.values.push_back(v ? pick(*v) : kNoValue);
      s.notes.push_back(v ? "" : "not run");
    }
    p.series.push_back(std::move(s));
  }
  return p;
}

BarPanel latency_panel(const EvalResult& r, const std::string& title, Percentiles EvalVariant::*metric) {
  BarPanel p;
  p.title = title;
  p.y_label = "ms";
  p.categories = {"p50", "p90", "p99"};
  for (const auto& v : r.variants) {
    const Percentiles& d = v.*metric;
    BarSeries s;
    s.name = v.name;
    s.colour = variant_colour(v.name);
    for (double q : {d.p50, d.p90, d.p99}) {
      s.values.push_back(d.count > 0 ? 1e3 * q : kNoValue);
      s.notes.push_back(d.count > 0 ? "" : "no samples");
    }
    p.series.push_back(std::move(s));
  }
  // A baseline-only run still names its one series.
  if (p.series.size() == 1) p.legend = {{p.series[0].name, p.series[0].colour, false}};
  return p;
}

struct KernelGroup {
  std::string op, model;
  int64_t tp = 1;
  std::vector<const KernelRow*> rows;
  std::string title() const { return op + "  " + model + "  tp=" + std::to_string(tp); }
};

std::vector<KernelGroup> kernel_groups(const KernelsResult& r) {
  std::vector<KernelGroup> groups;
  for (const auto& row : r.rows) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const KernelGroup& g) {
      return g.op == row.op && g.model == row.model && g.tp == row.tp;
    });
    if (it == groups.end()) {
      groups.push_back({row.op, row.model, row.tp, {}});
      it = groups.end() - 1;
    }
    it->rows.push_back(&row);
  }
  return groups;
}

const char* verdict_colour(const std::string& verdict) {
  if (verdict == "PASS") return kPassColour;
  if (verdict == "FAIL" || verdict == "ERROR") return kFailColour;
  return kUncheckedColour;
}

// Over passing cases with both times, as `kb_nano kernels` summarises.
double geomean_speedup(const std::vector<const KernelRow*>& rows) {
  double log_sum = 0;
  int n = 0;
  for (const auto* r : rows)
    if (r->verdict == "PASS" && r->speedup > 0) log_sum += std::log(r->speedup), n++;
  return n ? std::exp(log_sum / n) : 0;
}

// "file, device, mode M" and, on a second line when `two_lines`, "commit C, date".
std::string kernels_context(const ResultFile& f, bool two_lines) {
  const KernelsResult& r = f.kernels;
  std::string s = file_name(f.path);
  if (!r.device.empty()) s += ", " + r.device;
  if (!r.mode.empty()) s += ", mode " + r.mode;
  std::string when;
  if (!r.commit.empty()) when = "commit " + r.commit;
  if (!r.date.empty()) when += (when.empty() ? "" : ", ") + r.date;
  if (when.empty()) return s;
  return s + (two_lines ? "\n" : ", ") + when;
}

}  // namespace

std::vector<Plot> eval_plots(const std::vector<const ResultFile*>& files) {
  std::vector<Plot> plots;
  if (files.empty()) return plots;
  const std::string context = eval_context(files);
  const std::vector<std::string> labels = workload_labels(files);

  Plot thr;
  thr.file = "eval_throughput.svg";
  thr.caption = "Throughput per workload";
  thr.figure.title = "Serving throughput per workload";
  thr.figure.subtitle = context;
  thr.figure.panels.push_back(
      workload_panel(files, "Output tokens/s", "tokens/s", [](const EvalVariant& v) { return v.output_tokens_per_s; }));
  thr.figure.panels.push_back(workload_panel(files, "Total tokens/s (prompt + output)", "tokens/s",
                                             [](const EvalVariant& v) { return v.total_tokens_per_s; }));
  plots.push_back(std::move(thr));

  for (size_t i = 0; i < files.size(); ++i) {
    const EvalResult& r = files[i]->eval;
    Plot lat;
    lat.file = "eval_latency_" + slug(labels[i]) + ".svg";
    lat.caption = "Latency percentiles, " + labels[i];
    lat.figure.title = "Latency percentiles: " + labels[i];
    const int64_t requests = r.variants.empty() ? 0 : r.variants.front().num_requests;
    lat.figure.subtitle = r.model + (r.device.empty() ? "" : " on " + r.device) + ", " + std::to_string(requests) +
                          " requests (" + file_name(files[i]->path) + ")";
    lat.figure.panels = {latency_panel(r, "TTFT (time to first token)", &EvalVariant::ttft_s),
                         latency_panel(r, "TPOT (time per output token)", &EvalVariant::tpot_s),
                         latency_panel(r, "ITL (inter-token latency)", &EvalVariant::itl_s),
                         latency_panel(r, "E2E (end-to-end request latency)", &EvalVariant::e2e_s)};
    plots.push_back(std::move(lat));
  }

  std::vector<const ResultFile*> aligned;
  std::vector<std::string> aligned_labels;
  for (size_t i = 0; i < files.size(); ++i)
    if (files[i]->eval.has_alignment) aligned.push_back(files[i]), aligned_labels.push_back(labels[i]);
  if (!aligned.empty()) {
    Plot al;
    al.file = "eval_alignment.svg";
    al.caption = "Greedy alignment of candidate and baseline outputs";
    al.figure.title = "Greedy alignment, candidate vs baseline";
    al.figure.subtitle = eval_context(aligned);
    BarPanel rate;
    rate.title = "Exact-match rate (identical outputs)";
    rate.y_label = "% of requests";
    rate.categories = aligned_labels;
    rate.value_suffix = "%";
    BarSeries rs{"exact match", kPassColour, {}, {}, {}};
    for (const auto* f : aligned) rs.values.push_back(100 * f->eval.alignment.exact_match_rate);
    rate.series = {rs};
    BarPanel prefix;
    prefix.title = "Mean matching prefix per request";
    prefix.y_label = "tokens";
    prefix.categories = aligned_labels;
    BarSeries ps{"matching prefix", kCandidateColour, {}, {}, {}};
    BarSeries os{"baseline output length", kBaselineColour, {}, {}, {}};
    for (const auto* f : aligned) {
      ps.values.push_back(f->eval.alignment.mean_matching_prefix);
      const EvalVariant* b = f->eval.find("baseline");
      os.values.push_back(b && b->num_requests > 0 ? double(b->output_tokens) / double(b->num_requests) : kNoValue);
    }
    prefix.series = {ps, os};
    al.figure.panels = {rate, prefix};
    plots.push_back(std::move(al));
  }

  std::vector<const ResultFile*> floored;
  for (const auto* f : files)
    if (std::any_of(f->eval.variants.begin(), f->eval.variants.end(),
                    [](const EvalVariant& v) { return v.has_serial_floor; }))
      floored.push_back(f);
  if (!floored.empty()) {
    Plot sf;
    sf.file = "eval_serial_floor.svg";
    sf.caption = "Serial floor per workload: the share of it reached, and measured against floor seconds";
    sf.figure.title = "Serial floor: GEMMs, KV reads and attention FLOPs one after the other, at the measured rates";
    sf.figure.subtitle = eval_context(floored);
    BarPanel achieved =
        workload_panel(floored, "Floor / measured duration", "% of the serial floor's speed",
                       [](const EvalVariant& v) { return v.has_serial_floor ? 100 * v.floor_achieved : kNoValue; });
    achieved.value_suffix = "%";
    achieved.has_reference = true;
    achieved.reference = 100;
    achieved.reference_label = "at the floor";
    BarPanel seconds = workload_panel(floored, "Measured duration and serial floor", "seconds",
                                      [](const EvalVariant& v) { return v.duration_s; });
    for (auto& s : seconds.series) s.name = "measured, " + s.name;
    // The variants' floors differ only when their steps do; the baseline's stands for the workload.
    BarSeries floor_series{"serial floor", kUncheckedColour, {}, {}, {}};
    for (const auto* f : floored) {
      const EvalVariant* v = f->eval.find("baseline");
      if (!v || !v->has_serial_floor) v = f->eval.find("candidate");
      floor_series.values.push_back(v && v->has_serial_floor ? v->floor_s : kNoValue);
      floor_series.notes.push_back(v && v->has_serial_floor ? "" : "no floor");
    }
    seconds.series.push_back(std::move(floor_series));
    sf.figure.panels = {achieved, seconds};
    plots.push_back(std::move(sf));
  }

  for (size_t i = 0; i < files.size(); ++i) {
    const EvalResult& r = files[i]->eval;
    std::vector<const EvalVariant*> traced;
    for (const auto& v : r.variants)
      if (v.has_kernel_trace) traced.push_back(&v);
    if (traced.empty()) continue;
    Plot kt;
    kt.file = "eval_kernel_time_" + slug(labels[i]) + ".svg";
    kt.caption = "GPU time per op, " + labels[i];
    kt.figure.title = "Where the GPU time goes: " + labels[i];
    kt.figure.subtitle = r.model + (r.device.empty() ? "" : " on " + r.device) +
                         ", every kernel of the run (CUPTI), seconds (" + file_name(files[i]->path) + ")";
    BarPanel panel;
    panel.title = "GPU seconds per op, and time with no kernel running";
    panel.y_label = "seconds";
    for (const auto& [op, _] : traced.front()->op_seconds) panel.categories.push_back(op);
    for (const auto* v : traced)
      for (const auto& [op, _] : v->op_seconds)
        if (std::find(panel.categories.begin(), panel.categories.end(), op) == panel.categories.end())
          panel.categories.push_back(op);
    panel.categories.push_back("GPU idle");
    for (const auto* v : traced) {
      BarSeries series{v->name, v->name == "baseline" ? kBaselineColour : kCandidateColour, {}, {}, {}};
      for (size_t c = 0; c + 1 < panel.categories.size(); ++c) {
        double seconds = 0;
        for (const auto& [op, sec] : v->op_seconds)
          if (op == panel.categories[c]) seconds = sec;
        series.values.push_back(seconds);
      }
      series.values.push_back(std::max(0.0, v->trace_wall_s - v->trace_busy_s));
      panel.series.push_back(std::move(series));
    }
    // The busy time attributed to each op (what it costs the stream when kernels overlap), where the file has it; its
    // bars and the idle bar add up to the wall time.
    for (const auto* v : traced) {
      if (v->op_attributed_s.empty()) continue;
      BarSeries series{"attributed, " + v->name, kBf16Colour, {}, {}, {}};
      for (size_t c = 0; c + 1 < panel.categories.size(); ++c) {
        double seconds = 0;
        for (const auto& [op, sec] : v->op_attributed_s)
          if (op == panel.categories[c]) seconds = sec;
        series.values.push_back(seconds);
      }
      series.values.push_back(kNoValue);
      panel.series.push_back(std::move(series));
    }
    // Each op's share of the serial floor beside its GPU time (ops the floor does not count get no bar).
    for (const auto* v : traced) {
      if (!v->has_serial_floor) continue;
      BarSeries series{"serial floor, " + v->name, kUncheckedColour, {}, {}, {}};
      for (size_t c = 0; c + 1 < panel.categories.size(); ++c) {
        double seconds = kNoValue;
        for (const auto& [op, sec] : v->op_floor_s)
          if (op == panel.categories[c]) seconds = sec;
        series.values.push_back(seconds);
      }
      series.values.push_back(kNoValue);
      panel.series.push_back(std::move(series));
    }
    kt.figure.panels = {panel};
    kt.figure.columns = 1;
    plots.push_back(std::move(kt));
  }
  return plots;
}

namespace {

// The plots of one (op, model, tp) group of a kernels result.
std::vector<Plot> group_plots(const ResultFile& file, const KernelGroup& g) {
  const KernelsResult& r = file.kernels;
  std::vector<Plot> plots;
  const std::string stem = "kernels_" + slug(g.op) + "_" + slug(g.model) + "_tp" + std::to_string(g.tp);
  std::vector<std::string> cases;
  for (const auto* row : g.rows) cases.push_back(row->label);

  if (r.compare) {
    BarPanel p;
    p.title = "Speedup per case (baseline time / candidate time)";
    p.y_label = "speedup";
    p.categories = cases;
    p.value_suffix = "x";
    p.has_reference = true;
    p.reference = 1.0;
    p.reference_label = "1.0x";
    BarSeries s{"speedup", kPassColour, {}, {}, {}};
    bool pass = false, fail = false, unchecked = false;
    for (const auto* row : g.rows) {
      const bool timed = row->speedup > 0;
      s.values.push_back(timed ? row->speedup : kNoValue);
      s.colours.push_back(verdict_colour(row->verdict));
      s.notes.push_back(timed ? "" : row->verdict == "PASS" ? "not timed" : row->verdict);
      pass |= row->verdict == "PASS";
      fail |= row->verdict == "FAIL" || row->verdict == "ERROR";
      unchecked |= row->verdict != "PASS" && row->verdict != "FAIL" && row->verdict != "ERROR";
    }
    p.series = {s};
    if (pass) p.legend.push_back({"PASS", kPassColour, false});
    if (fail) p.legend.push_back({"FAIL / ERROR", kFailColour, false});
    if (unchecked) p.legend.push_back({"not validated", kUncheckedColour, false});
    p.legend.push_back({"baseline speed", "#555555", true});
    Plot plot;
    plot.file = stem + "_speedup.svg";
    plot.caption = "Speedup per case, " + g.title();
    plot.figure.title = "Candidate speedup: " + g.title();
    const double gm = geomean_speedup(g.rows);
    plot.figure.subtitle =
        kernels_context(file, true) + (gm > 0 ? "; geometric mean over passing cases " + fmt("%.3f", gm) + "x" : "");
    plot.figure.panels = {p};
    plots.push_back(std::move(plot));
  }

  {
    BarPanel p;
    p.title = r.compare ? "Median time per case, baseline vs candidate" : "Median time per case";
    p.y_label = "median time (us)";
    p.categories = cases;
    double lo = INFINITY, hi = 0;
    for (const bool cand : {false, true}) {
      if (cand && !r.compare) break;
      BarSeries s{cand ? "candidate" : "baseline", cand ? kCandidateColour : kBaselineColour, {}, {}, {}};
      for (const auto* row : g.rows) {
        const KernelTiming& t = cand ? row->candidate : row->baseline;
        const double us = t.timed ? 1e3 * t.median_ms : kNoValue;
        s.values.push_back(us);
        s.notes.push_back(t.timed ? "" : "not timed");
        if (t.timed && us > 0) lo = std::min(lo, us), hi = std::max(hi, us);
      }
      p.series.push_back(std::move(s));
    }
    // NOTE: cases run from one token to 16k; on a linear axis the decode cases would be invisible.
    p.log_scale = hi > 0 && hi / lo > 100;
    if (p.series.size() == 1) p.legend = {{p.series[0].name, p.series[0].colour, false}};
    Plot plot;
    plot.file = stem + "_time.svg";
    plot.caption = "Median time per case, " + g.title();
    plot.figure.title = "Kernel time: " + g.title();
    plot.figure.subtitle = kernels_context(file, true);
    plot.figure.panels = {p};
    plots.push_back(std::move(plot));
  }

  const bool roofline =
      std::any_of(g.rows.begin(), g.rows.end(), [](const KernelRow* row) { return row->pct_copy >= 0; });
  if (roofline) {
    BarPanel p;
    // `kb_nano kernels` puts the roofline of the variant of interest on the row: the candidate's when comparing.
    p.title = std::string("Achieved % of the measured ceilings (") + (r.compare ? "candidate" : "baseline") + ")";
    p.y_label = "% of ceiling";
    p.categories = cases;
    p.value_suffix = "%";
    p.has_reference = true;
    p.reference = 100;
    p.reference_label = "ceiling";
    const std::string copy_ceiling = r.copy_gb_per_s > 0 ? " (" + fmt("%.0f", r.copy_gb_per_s) + " GB/s)" : "";
    const std::string bf16_ceiling = r.bf16_tflop_per_s > 0 ? " (" + fmt("%.0f", r.bf16_tflop_per_s) + " TFLOP/s)" : "";
    BarSeries copy{"% of copy bandwidth" + copy_ceiling, kBaselineColour, {}, {}, {}};
    BarSeries bf16{"% of bf16 rate" + bf16_ceiling, kBf16Colour, {}, {}, {}};
    for (const auto* row : g.rows) {
      copy.values.push_back(row->pct_copy >= 0 ? row->pct_copy : kNoValue);
      bf16.values.push_back(row->pct_bf16 >= 0 ? row->pct_bf16 : kNoValue);
      copy.notes.push_back(row->pct_copy >= 0 ? "" : "not timed");
    }
    p.series = {copy, bf16};
    Plot plot;
    plot.file = stem + "_ceiling.svg";
    plot.caption = "Achieved % of the ceilings, " + g.title();
    plot.figure.title = "Roofline: " + g.title();
    plot.figure.subtitle = kernels_context(file, true);
    plot.figure.panels = {p};
    plots.push_back(std::move(plot));
  }
  return plots;
}

}  // namespace

std::vector<Plot> kernels_plots(const ResultFile& file) {
  std::vector<Plot> plots;
  for (const KernelGroup& g : kernel_groups(file.kernels))
    for (auto& p : group_plots(file, g)) plots.push_back(std::move(p));
  return plots;
}

namespace {

struct Table {
  std::vector<std::string> head;
  std::vector<std::vector<std::string>> rows;
};

// One block of the index, rendered to Markdown and to HTML.
struct Block {
  enum Kind { heading, paragraph, plot, table } kind;
  std::string text;  // heading or paragraph text; the plot's file
  std::string caption;
  Table tab;
};

std::string md_cell(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n')
      out += ' ';
    else
      out += c;
  }
  return out;
}

std::string markdown(const std::string& title, const std::vector<Block>& blocks) {
  std::string out = "# " + title + "\n";
  for (const Block& b : blocks) {
    out += "\n";
    switch (b.kind) {
      case Block::heading:
        out += "## " + b.text + "\n";
        break;
      case Block::paragraph:
        out += b.text + "\n";
        break;
      case Block::plot:
        out += "![" + md_cell(b.caption) + "](" + b.text + ")\n";
        break;
      case Block::table: {
        out += "|";
        for (const auto& h : b.tab.head) out.append(" ").append(md_cell(h)).append(" |");
        out += "\n|";
        for (size_t i = 0; i < b.tab.head.size(); ++i) out += " --- |";
        out += "\n";
        for (const auto& r : b.tab.rows) {
          out += "|";
          for (const auto& c : r) out.append(" ").append(md_cell(c)).append(" |");
          out += "\n";
        }
        break;
      }
    }
  }
  return out;
}

std::string html(const std::string& title, const std::vector<Block>& blocks) {
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>" + xml_escape(title) +
      "</title>\n<style>\nbody { font-family: Helvetica, Arial, sans-serif; margin: 2em; color: #333; }\n"
      "table { border-collapse: collapse; margin: 1em 0; font-size: 13px; }\n"
      "th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }\nth { background: #f3f3f3; }\n"
      "img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }\n</style>\n</head>\n<body>\n<h1>" +
      xml_escape(title) + "</h1>\n";
  for (const Block& b : blocks) {
    switch (b.kind) {
      case Block::heading:
        out += "<h2>" + xml_escape(b.text) + "</h2>\n";
        break;
      case Block::paragraph:
        out += "<p>" + xml_escape(b.text) + "</p>\n";
        break;
      case Block::plot:
        out += "<figure><img src=\"" + xml_escape(b.text) + "\" alt=\"" + xml_escape(b.caption) + "\"/><figcaption>" +
               xml_escape(b.caption) + "</figcaption></figure>\n";
        break;
      case Block::table: {
        out += "<table>\n<tr>";
        for (const auto& h : b.tab.head) out += "<th>" + xml_escape(h) + "</th>";
        out += "</tr>\n";
        for (const auto& r : b.tab.rows) {
          out += "<tr>";
          for (const auto& c : r) out += "<td>" + xml_escape(c) + "</td>";
          out += "</tr>\n";
        }
        out += "</table>\n";
        break;
      }
    }
  }
  return out + "</body>\n</html>\n";
}

std::string ms3(const Percentiles& d) {
  if (d.count == 0) return "-";
  return short_number(1e3 * d.p50) + " / " + short_number(1e3 * d.p90) + " / " + short_number(1e3 * d.p99);
}

std::string ratio(double cand, double base) {
  return base > 0 && std::isfinite(cand) ? fmt("%.3fx", cand / base) : "-";
}

std::string ratio3(const Percentiles& c, const Percentiles& b) {
  if (c.count == 0 || b.count == 0) return "-";
  return ratio(c.p50, b.p50) + " / " + ratio(c.p90, b.p90) + " / " + ratio(c.p99, b.p99);
}

std::string us(const KernelTiming& t) { return t.timed ? fmt("%.2f", 1e3 * t.median_ms) : "-"; }

void add_eval_blocks(std::vector<Block>& blocks, const std::vector<const ResultFile*>& files,
                     const std::vector<Plot>& plots) {
  const std::vector<std::string> labels = workload_labels(files);
  blocks.push_back({Block::heading, "Serving eval", "", {}});
  for (const auto& p : plots) blocks.push_back({Block::plot, p.file, p.caption, {}});
  Table t;
  t.head = {"workload",
            "variant",
            "requests",
            "output tok/s",
            "total tok/s",
            "req/s",
            "TTFT ms p50/p90/p99",
            "TPOT ms p50/p90/p99",
            "ITL ms p50/p90/p99",
            "E2E ms p50/p90/p99"};
  for (size_t i = 0; i < files.size(); ++i) {
    const EvalResult& r = files[i]->eval;
    for (const auto& v : r.variants)
      t.rows.push_back({labels[i], v.name, std::to_string(v.num_requests), fmt("%.1f", v.output_tokens_per_s),
                        fmt("%.1f", v.total_tokens_per_s), fmt("%.3f", v.requests_per_s), ms3(v.ttft_s), ms3(v.tpot_s),
                        ms3(v.itl_s), ms3(v.e2e_s)});
    const EvalVariant* b = r.find("baseline");
    const EvalVariant* c = r.find("candidate");
    if (b && c)
      t.rows.push_back({labels[i], "candidate/baseline", "", ratio(c->output_tokens_per_s, b->output_tokens_per_s),
                        ratio(c->total_tokens_per_s, b->total_tokens_per_s),
                        ratio(c->requests_per_s, b->requests_per_s), ratio3(c->ttft_s, b->ttft_s),
                        ratio3(c->tpot_s, b->tpot_s), ratio3(c->itl_s, b->itl_s), ratio3(c->e2e_s, b->e2e_s)});
  }
  blocks.push_back({Block::table, "", "", t});

  Table a;
  a.head = {"workload",
            "requests",
            "identical",
            "exact-match rate",
            "mean matching prefix (tokens)",
            "% of baseline output",
            "min matching prefix",
            "first divergences scored",
            "baseline's margin, median / max (stds)",
            "candidate token in baseline's top 2"};
  for (size_t i = 0; i < files.size(); ++i) {
    const EvalResult& r = files[i]->eval;
    if (!r.has_alignment) continue;
    const EvalAlignment& al = r.alignment;
    const bool d = al.has_divergences && al.scored > 0;
    a.rows.push_back({labels[i], std::to_string(al.requests), std::to_string(al.exact_match),
                      fmt("%.1f%%", 100 * al.exact_match_rate), fmt("%.1f", al.mean_matching_prefix),
                      fmt("%.1f%%", 100 * al.mean_matching_prefix_fraction), std::to_string(al.min_matching_prefix),
                      al.has_divergences ? std::to_string(al.scored) + " of " + std::to_string(al.diverged) : "-",
                      d ? fmt("%.3g", al.median_margin_over_std) + " / " + fmt("%.3g", al.max_margin_over_std) : "-",
                      d ? fmt("%.1f%%", 100 * al.rank2_fraction) : "-"});
  }
  if (!a.rows.empty()) {
    blocks.push_back({Block::paragraph,
                      "Greedy alignment of the candidate's outputs with the baseline's. At each scored first "
                      "divergence the baseline reran the common prefix: its logit for its own token minus the "
                      "candidate's, in standard deviations of its logits over the vocabulary. Near zero with the "
                      "candidate's token its second choice is a near-tie that rounding flips; a margin of a sizeable "
                      "fraction of a std or more is a choice the baseline ranks clearly lower.",
                      "",
                      {}});
    blocks.push_back({Block::table, "", "", a});
  }

  Table f;
  f.head = {"workload", "variant",    "duration s",        "serial floor s",
            "GEMMs s",  "KV reads s", "attention FLOPs s", "floor / duration"};
  for (size_t i = 0; i < files.size(); ++i)
    for (const auto& v : files[i]->eval.variants) {
      if (v.has_serial_floor)
        f.rows.push_back({labels[i], v.name, fmt("%.3f", v.duration_s), fmt("%.3f", v.floor_s),
                          fmt("%.3f", v.floor_gemm_s), fmt("%.3f", v.floor_kv_read_s),
                          fmt("%.3f", v.floor_attention_flops_s), fmt("%.1f%%", 100 * v.floor_achieved)});
      else if (!v.no_floor_reason.empty())
        f.rows.push_back({labels[i], v.name, fmt("%.3f", v.duration_s), "n/a: " + v.no_floor_reason, "", "", "", ""});
    }
  if (!f.rows.empty()) {
    blocks.push_back({Block::paragraph,
                      "Serial floor of each run (eval on a GPU): the sum over the steps the engine executed of "
                      "max(weight bytes / copy rate, GEMM FLOPs / bf16 GEMM rate) + KV bytes read / copy rate + "
                      "attention FLOPs / bf16 GEMM rate, at the rates measured when the run started; MoE expert "
                      "weights are the expected experts touched under uniform routing. Floor / duration is the "
                      "share of that speed the run reached.",
                      "",
                      {}});
    blocks.push_back({Block::table, "", "", f});
  }
  Table o;
  o.head = {"workload", "variant", "op", "serial floor s", "GPU seconds (kernel trace)", "floor / GPU seconds"};
  for (size_t i = 0; i < files.size(); ++i)
    for (const auto& v : files[i]->eval.variants)
      for (const auto& [op, floor] : v.op_floor_s) {
        double measured = kNoValue;
        for (const auto& [name, sec] : v.op_seconds)
          if (name == op) measured = sec;
        for (const auto& [name, sec] : v.op_floor_kernel_s)
          if (name == op) measured = sec;
        const bool traced = v.has_kernel_trace && std::isfinite(measured) && measured > 0;
        o.rows.push_back({labels[i], v.name, op, fmt("%.3f", floor), traced ? fmt("%.3f", measured) : "-",
                          traced ? fmt("%.1f%%", 100 * floor / measured) : "-"});
      }
  if (!o.rows.empty()) {
    blocks.push_back({Block::paragraph,
                      "The serial floor by op: a step's GEMM term goes to the ops by their bytes when bytes bound it, "
                      "else by their FLOPs; attention to the decode and prefill kernels. Ops not listed are not "
                      "counted in the floor.",
                      "",
                      {}});
    blocks.push_back({Block::table, "", "", o});
  }

  Table k;
  k.head = {"workload", "variant", "op", "GPU seconds", "share of kernel time", "attributed s", "share of busy time"};
  for (size_t i = 0; i < files.size(); ++i)
    for (const auto& v : files[i]->eval.variants) {
      if (!v.has_kernel_trace) continue;
      double attributed_total = 0;  // the busy time of every device
      for (const auto& [_, a] : v.op_attributed_s) attributed_total += a;
      for (size_t o = 0; o < v.op_seconds.size(); ++o) {
        const auto& [op, sec] = v.op_seconds[o];
        const bool attributed = o < v.op_attributed_s.size();
        const double a = attributed ? v.op_attributed_s[o].second : 0.0;
        k.rows.push_back({labels[i], v.name, op, fmt("%.3f", sec),
                          fmt("%.1f%%", v.trace_kernel_s > 0 ? 100 * sec / v.trace_kernel_s : 0.0),
                          attributed ? fmt("%.3f", a) : "-",
                          attributed && attributed_total > 0 ? fmt("%.1f%%", 100 * a / attributed_total) : "-"});
      }
      k.rows.push_back({labels[i], v.name, "GPU idle (no kernel running)",
                        fmt("%.3f", std::max(0.0, v.trace_wall_s - v.trace_busy_s)),
                        fmt("of %.3f s wall", v.trace_wall_s), "", ""});
    }
  if (!k.rows.empty()) {
    blocks.push_back({Block::paragraph,
                      "GPU time per op from the kernel trace (eval --kernel-trace: every kernel of the run, CUPTI; "
                      "attributed: the busy time during which the op's kernel was the oldest one running, so "
                      "overlapping kernels are counted once):",
                      "",
                      {}});
    blocks.push_back({Block::table, "", "", k});
  }
}

void add_kernel_group_blocks(std::vector<Block>& blocks, const ResultFile& f, const KernelGroup& g,
                             const std::vector<Plot>& plots) {
  const KernelsResult& r = f.kernels;
  blocks.push_back({Block::heading, "Kernels: " + g.title(), "", {}});
  int pass = 0, fail = 0;
  for (const auto* row : g.rows) {
    pass += row->verdict == "PASS";
    fail += row->verdict == "FAIL" || row->verdict == "ERROR";
  }
  std::string summary = kernels_context(f, false) + ". " + std::to_string(pass) + " of " +
                        std::to_string(g.rows.size()) + " cases pass, " + std::to_string(fail) + " fail";
  const size_t unchecked = g.rows.size() - size_t(pass + fail);
  if (unchecked > 0) summary += ", " + std::to_string(unchecked) + " not validated";
  const double gm = geomean_speedup(g.rows);
  if (gm > 0) summary += "; geometric-mean speedup over passing cases " + fmt("%.3f", gm) + "x";
  blocks.push_back({Block::paragraph, summary + ".", "", {}});
  for (const auto& p : plots) blocks.push_back({Block::plot, p.file, p.caption, {}});

  const bool roofline =
      std::any_of(g.rows.begin(), g.rows.end(), [](const KernelRow* row) { return row->pct_copy >= 0; });
  Table t;
  t.head = {"case", "check"};
  if (r.compare)
    t.head.insert(t.head.end(), {"base us", "cand us", "speedup"});
  else
    t.head.push_back("median us");
  if (roofline) t.head.insert(t.head.end(), {"% copy BW", "% bf16"});
  t.head.push_back("why");
  for (const auto* row : g.rows) {
    std::vector<std::string> cells = {row->label, row->verdict};
    if (r.compare)
      cells.insert(cells.end(),
                   {us(row->baseline), us(row->candidate), row->speedup > 0 ? fmt("%.3fx", row->speedup) : "-"});
    else
      cells.push_back(us(row->baseline));
    if (roofline) {
      cells.push_back(row->pct_copy >= 0 ? fmt("%.1f", row->pct_copy) : "-");
      cells.push_back(row->pct_bf16 >= 0 ? fmt("%.1f", row->pct_bf16) : "-");
    }
    cells.push_back(row->reason);
    t.rows.push_back(std::move(cells));
  }
  blocks.push_back({Block::table, "", "", t});
}

void write_file(const std::filesystem::path& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  KBN_CHECK(out.good(), "--out: cannot write '", path.string(), "' (", std::strerror(errno), ")");
  out << content;
  out.close();
  KBN_CHECK(out.good(), "--out: writing '", path.string(), "' failed (", std::strerror(errno), ")");
}

}  // namespace

std::vector<std::string> write_report(const std::vector<ResultFile>& files, const ReportOptions& options) {
  KBN_CHECK(!files.empty(), "kb_nano report: no result file given");
  namespace fs = std::filesystem;
  const fs::path dir(options.out_dir.empty() ? "." : options.out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  KBN_CHECK(!ec && fs::is_directory(dir), "--out: cannot create the folder '", dir.string(), "' (", ec.message(), ")");

  std::vector<const ResultFile*> evals;
  for (const auto& f : files)
    if (f.kind == ResultKind::eval) evals.push_back(&f);

  // Two kernels files may hold the same (op, model, tp) group: later plots get _2, _3, ... rather than
  // overwriting earlier ones.
  std::set<std::string> taken;
  auto unique = [&](std::vector<Plot> plots) {
    for (auto& p : plots) {
      const std::string stem = p.file.substr(0, p.file.size() - 4);
      for (int i = 2; taken.count(p.file); ++i) p.file = stem + "_" + std::to_string(i) + ".svg";
      taken.insert(p.file);
    }
    return plots;
  };

  std::vector<Block> blocks;
  Table inputs;
  inputs.head = {"file", "kind", "contents", "model", "device", "commit", "date"};
  for (const auto& f : files) {
    if (f.kind == ResultKind::eval) {
      const EvalResult& e = f.eval;
      std::string variants;
      for (const auto& v : e.variants) variants += (variants.empty() ? "" : " + ") + v.name;
      inputs.rows.push_back({f.path, "eval", e.workload + " (" + variants + ")", e.model, e.device, e.commit, e.date});
    } else {
      const KernelsResult& k = f.kernels;
      std::vector<std::string> ops, models;
      for (const auto& row : k.rows) ops.push_back(row.op), models.push_back(row.model);
      inputs.rows.push_back({f.path, "kernels",
                             joined_distinct(ops, ", ") + " (" + std::to_string(k.rows.size()) + " cases, " +
                                 (k.compare ? "baseline vs candidate" : "baseline") + ")",
                             joined_distinct(models, ", "), k.device, k.commit, k.date});
    }
  }
  blocks.push_back({Block::paragraph, "Plots of " + std::to_string(files.size()) + " result file(s):", "", {}});
  blocks.push_back({Block::table, "", "", inputs});

  std::vector<Plot> all;
  if (!evals.empty()) {
    std::vector<Plot> plots = unique(eval_plots(evals));
    add_eval_blocks(blocks, evals, plots);
    for (auto& p : plots) all.push_back(std::move(p));
  }
  for (const auto& f : files) {
    if (f.kind != ResultKind::kernels) continue;
    for (const KernelGroup& g : kernel_groups(f.kernels)) {
      std::vector<Plot> plots = unique(group_plots(f, g));
      add_kernel_group_blocks(blocks, f, g, plots);
      for (auto& p : plots) all.push_back(std::move(p));
    }
  }

  std::vector<std::string> written;
  for (const auto& p : all) {
    write_file(dir / p.file, render_svg(p.figure));
    written.push_back((dir / p.file).string());
  }
  write_file(dir / "index.md", markdown(options.title, blocks));
  written.push_back((dir / "index.md").string());
  write_file(dir / "index.html", html(options.title, blocks));
  written.push_back((dir / "index.html").string());
  return written;
}

}  // namespace kbn::bench
