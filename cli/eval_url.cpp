#include "cli/eval_url.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "engine/metrics.h"
#include "kbn/error.h"
#include "kbn/version.h"

namespace kbn::cli {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Outcome {
  bool ok = false;
  std::string error;
  int64_t prompt_tokens = 0, output_tokens = 0;
  double start = 0, ttft = 0, e2e = 0;  // seconds; start from the run's beginning
  std::vector<double> itl;              // gaps between streamed chunks that carried text
};

httplib::Client make_client(const std::string& url) {
  KBN_CHECK(url.rfind("http://", 0) == 0, "--url: expected http://host:port, got '", url, "'");
  httplib::Client c(url);
  c.set_connection_timeout(10, 0);
  c.set_read_timeout(3600, 0);
  c.set_write_timeout(60, 0);
  return c;
}

// One streamed completion; every time is taken as its bytes arrive.
Outcome send_one(const std::string& url, const std::string& model, const engine::Request& r, Clock::time_point t0) {
  Outcome out;
  out.prompt_tokens = int64_t(r.prompt.size());
  json body = {{"model", model},
               {"prompt", r.prompt},
               {"max_tokens", r.sampling.max_tokens},
               {"temperature", 0.0},
               {"ignore_eos", true},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  httplib::Client c = make_client(url);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  std::string buf, error_body;
  double last = 0;
  bool first = true, done = false;
  int64_t chunks_with_text = 0;
  out.start = seconds_since(t0);
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    const double now = seconds_since(t0);
    buf.append(data, n);
    size_t pos;
    while ((pos = buf.find("\n\n")) != std::string::npos) {
      const std::string event = buf.substr(0, pos);
      buf.erase(0, pos + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const std::string payload = event.substr(6);
      if (payload == "[DONE]") {
        done = true;
        continue;
      }
      json j;
      try {
        j = json::parse(payload);
      } catch (const json::exception&) {
        error_body = "an event that is not JSON: " + payload.substr(0, 200);
        return false;
      }
      if (j.contains("error")) {
        error_body = j["error"].value("message", j["error"].dump());
        return false;
      }
      if (j.contains("usage") && j["usage"].is_object()) out.output_tokens = j["usage"].value("completion_tokens", 0);
      bool text = false;
      for (const auto& ch : j.value("choices", json::array()))
        if (ch.contains("text") && ch["text"].is_string() && !ch["text"].get<std::string>().empty()) text = true;
      if (!text) continue;
      ++chunks_with_text;
      if (first) {
        out.ttft = now - out.start;
        first = false;
      } else {
        out.itl.push_back(now - last);
      }
      last = now;
    }
    return true;
  };
  const httplib::Result res = c.send(req);
  out.e2e = seconds_since(t0) - out.start;
  if (!res) {
    out.error = error_body.empty() ? "HTTP: " + httplib::to_string(res.error()) : error_body;
    return out;
  }
  if (res->status != 200) {
    out.error = "HTTP " + std::to_string(res->status) + ": " + (error_body.empty() ? buf : error_body).substr(0, 300);
    return out;
  }
  if (!done) {
    out.error = "the stream ended without [DONE]";
    return out;
  }
  if (out.output_tokens == 0) out.output_tokens = chunks_with_text;  // a server that sends no usage
  out.ok = true;
  return out;
}

json dist_json(const engine::Distribution& d) {
  return {{"mean", d.mean * 1e3}, {"p50", d.p50 * 1e3}, {"p90", d.p90 * 1e3}, {"p99", d.p99 * 1e3}};
}

}  // namespace

ServerInfo query_server(const std::string& url) {
  httplib::Client c = make_client(url);
  const httplib::Result res = c.Get("/v1/models");
  KBN_CHECK(res, "--url: cannot reach ", url, " (", httplib::to_string(res.error()), ")");
  KBN_CHECK(res->status == 200, "--url: ", url, "/v1/models answered HTTP ", res->status, ": ", res->body.substr(0, 200));
  ServerInfo info;
  try {
    const json j = json::parse(res->body);
    const json& m = j.at("data").at(0);
    info.model = m.at("id").get<std::string>();
    info.max_model_len = m.value("max_model_len", int64_t(0));
    info.vocab_size = m.value("vocab_size", int64_t(0));
  } catch (const json::exception& e) {
    KBN_FAIL("--url: ", url, "/v1/models is not an OpenAI model list (", e.what(), ")");
  }
  return info;
}

void measure_server(const UrlRunOptions& o, const std::vector<engine::Request>& requests) {
  KBN_CHECK(!requests.empty(), "eval --url: the workload has no requests");
  // Arrival times: a Poisson process of rate --request-rate (exponential gaps), or all at once.
  std::vector<double> arrival(requests.size(), 0.0);
  if (o.request_rate > 0) {
    std::mt19937_64 rng(o.seed);
    std::exponential_distribution<double> gap(o.request_rate);
    double t = 0;
    for (size_t i = 0; i < requests.size(); ++i) {
      arrival[i] = t;
      t += gap(rng);
    }
  }
  std::vector<Outcome> outcomes(requests.size());
  std::mutex m;
  std::condition_variable cv;
  int64_t in_flight = 0;
  std::vector<std::thread> threads;
  const Clock::time_point t0 = Clock::now();
  for (size_t i = 0; i < requests.size(); ++i) {
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrival[i])));
    if (o.max_concurrency > 0) {
      std::unique_lock<std::mutex> l(m);
      cv.wait(l, [&] { return in_flight < o.max_concurrency; });
    }
    {
      std::lock_guard<std::mutex> g(m);
      ++in_flight;
    }
    threads.emplace_back([&, i] {
      outcomes[i] = send_one(o.url, o.model, requests[i], t0);
      {
        std::lock_guard<std::mutex> g(m);
        --in_flight;
      }
      cv.notify_all();
    });
  }
  for (auto& t : threads) t.join();

  int64_t ok = 0, input_tokens = 0, output_tokens = 0;
  double end = 0;
  std::vector<double> ttft, tpot, itl, e2e;
  std::string first_error;
  for (const Outcome& r : outcomes) {
    if (!r.ok) {
      if (first_error.empty()) first_error = r.error;
      continue;
    }
    ++ok;
    input_tokens += r.prompt_tokens;
    output_tokens += r.output_tokens;
    end = std::max(end, r.start + r.e2e);
    ttft.push_back(r.ttft);
    e2e.push_back(r.e2e);
    if (r.output_tokens > 1) tpot.push_back((r.e2e - r.ttft) / double(r.output_tokens - 1));
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
  }
  const int64_t failed = int64_t(requests.size()) - ok;
  const double duration = end;
  const engine::Distribution d_ttft = engine::summarize(ttft), d_tpot = engine::summarize(tpot),
                             d_itl = engine::summarize(itl), d_e2e = engine::summarize(e2e);
  const std::string rate = o.request_rate > 0 ? std::to_string(o.request_rate) : "inf";
  std::printf("============ Serving Benchmark Result (%s) ============\n", o.url.c_str());
  std::printf("%-40s %s\n", "Model:", o.model.c_str());
  std::printf("%-40s %s\n", "Workload:", o.workload.c_str());
  std::printf("%-40s %s\n", "Request rate (req/s):", rate.c_str());
  std::printf("%-40s %s\n", "Max concurrency:",
              o.max_concurrency > 0 ? std::to_string(o.max_concurrency).c_str() : "none");
  std::printf("%-40s %lld\n", "Successful requests:", (long long)ok);
  std::printf("%-40s %lld%s%s\n", "Failed requests:", (long long)failed, failed ? "  first error: " : "",
              first_error.c_str());
  std::printf("%-40s %.2f\n", "Benchmark duration (s):", duration);
  std::printf("%-40s %lld\n", "Total input tokens:", (long long)input_tokens);
  std::printf("%-40s %lld\n", "Total generated tokens:", (long long)output_tokens);
  if (duration > 0) {
    std::printf("%-40s %.2f\n", "Request throughput (req/s):", double(ok) / duration);
    std::printf("%-40s %.2f\n", "Output token throughput (tok/s):", double(output_tokens) / duration);
    std::printf("%-40s %.2f\n", "Total token throughput (tok/s):", double(input_tokens + output_tokens) / duration);
  }
  auto block = [](const char* title, const char* key, const engine::Distribution& d) {
    std::printf("%s\n", title);
    std::printf("Mean %-35s %.2f\n", (std::string(key) + " (ms):").c_str(), d.mean * 1e3);
    std::printf("Median %-33s %.2f\n", (std::string(key) + " (ms):").c_str(), d.p50 * 1e3);
    std::printf("P90 %-36s %.2f\n", (std::string(key) + " (ms):").c_str(), d.p90 * 1e3);
    std::printf("P99 %-36s %.2f\n", (std::string(key) + " (ms):").c_str(), d.p99 * 1e3);
  };
  block("---------------Time to First Token----------------", "TTFT", d_ttft);
  block("-----Time per Output Token (excl. 1st token)------", "TPOT", d_tpot);
  block("---------------Inter-token Latency----------------", "ITL", d_itl);
  block("----------------End-to-end Latency----------------", "E2EL", d_e2e);
  std::printf("==================================================\n");

  if (!o.json.empty()) {
    json j = {{"url", o.url},
              {"model", o.model},
              {"workload", o.workload},
              {"request_rate", o.request_rate > 0 ? json(o.request_rate) : json("inf")},
              {"max_concurrency", o.max_concurrency},
              {"seed", o.seed},
              {"successful_requests", ok},
              {"failed_requests", failed},
              {"first_error", first_error},
              {"duration_s", duration},
              {"total_input_tokens", input_tokens},
              {"total_output_tokens", output_tokens},
              {"request_throughput", duration > 0 ? double(ok) / duration : 0.0},
              {"output_throughput", duration > 0 ? double(output_tokens) / duration : 0.0},
              {"ttft_ms", dist_json(d_ttft)},
              {"tpot_ms", dist_json(d_tpot)},
              {"itl_ms", dist_json(d_itl)},
              {"e2el_ms", dist_json(d_e2e)},
              {"client_commit", build_info().git_commit},
              {"command", o.command}};
    std::ofstream f(o.json);
    f << j.dump(2) << "\n";
    KBN_CHECK(f.good(), "--json: cannot write '", o.json, "'");
  }
  if (!o.csv.empty()) {
    std::ofstream f(o.csv);
    f << "url,model,workload,request_rate,successful,failed,duration_s,input_tokens,output_tokens,output_tok_s,"
         "ttft_mean_ms,ttft_p50_ms,ttft_p99_ms,tpot_mean_ms,tpot_p50_ms,tpot_p99_ms,itl_mean_ms,itl_p50_ms,itl_p99_ms,"
         "e2el_mean_ms,e2el_p50_ms,e2el_p99_ms\n";
    f << o.url << "," << o.model << "," << o.workload << "," << rate << "," << ok << "," << failed << "," << duration
      << "," << input_tokens << "," << output_tokens << "," << (duration > 0 ? double(output_tokens) / duration : 0.0);
    for (const auto* d : {&d_ttft, &d_tpot, &d_itl, &d_e2e}) f << "," << d->mean * 1e3 << "," << d->p50 * 1e3 << "," << d->p99 * 1e3;
    f << "\n";
    KBN_CHECK(f.good(), "--csv: cannot write '", o.csv, "'");
  }
  KBN_CHECK(ok > 0, "eval --url: no request succeeded (", failed, " failed; the first: ", first_error, ")");
}

}  // namespace kbn::cli
