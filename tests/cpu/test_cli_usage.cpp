// Usage errors in the tool's own words, never CLI11's defaults ("Value 0 not in range 0.000000 to 1797...", "A
// subcommand is required" for a misspelt one, "At Most 1 required but received 2"), with "did you mean" for
// misspelt commands, flags and choices, and one exit-code convention: 0 ok, 1 run failed, 2 usage error.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "test_paths.h"
#include "test_process.h"

namespace {

kbn::test::ShellResult kb_nano(const std::string& args) {
  return kbn::test::shell("KBN_MODELS_DIR=" KBN_SOURCE_DIR "/models " + kbn::test::kb_nano() + " " + args);
}

// Exit 2 with `message` in the output and none of CLI11's default phrasings.
void expect_usage_error(const std::string& args, const std::string& message) {
  if (kbn::test::kb_nano().empty()) GTEST_SKIP() << "kb_nano is not built next to the tests";
  const auto r = kb_nano(args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
  for (const char* leak : {"not in range", "A subcommand is required", "At Most", "Run with --help",
                           "were not expected", "was not expected", "Could not convert", "required TEXT missing"})
    EXPECT_EQ(r.output.find(leak), std::string::npos) << args << " leaks CLI11's '" << leak << "'\n" << r.output;
}

}  // namespace

TEST(CliUsage, EditDistanceAndSuggestions) {
  EXPECT_EQ(kbn::cli::edit_distance("genrate", "generate"), 1u);
  EXPECT_EQ(kbn::cli::edit_distance("", "abc"), 3u);
  EXPECT_EQ(kbn::cli::edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(kbn::cli::edit_distance("evla", "eval"), 1u);  // a swap of neighbours is one slip
  EXPECT_EQ(kbn::cli::closest("--max-new-token", {"--max-new-tokens", "--model"}), "--max-new-tokens");
  EXPECT_EQ(kbn::cli::closest("evla", {"eval", "list"}), "eval");
  EXPECT_EQ(kbn::cli::closest("serve", {"eval", "list", "report"}), "");  // nothing close: no suggestion
}

TEST(CliUsage, MisspeltCommandGetsASuggestion) {
  expect_usage_error("genrate --device cpu", "unknown command 'genrate'; did you mean 'generate'?");
  expect_usage_error("", "a command is needed, one of: list, generate");
}

TEST(CliUsage, MisspeltFlagGetsASuggestion) {
  expect_usage_error("generate --device cpu --max-new-token 3",
                     "kb_nano generate: unknown flag '--max-new-token'; did you mean '--max-new-tokens'?");
  expect_usage_error("eval --worklod balanced", "unknown flag '--worklod'; did you mean '--workload'?");
}

TEST(CliUsage, RangesInTheToolsWords) {
  expect_usage_error("generate --max-new-tokens 0", "--max-new-tokens: expected an integer >= 1, got '0'");
  expect_usage_error("generate --max-new-tokens abc", "--max-new-tokens: expected an integer >= 1, got 'abc'");
  expect_usage_error("list --level 7", "--level: expected a level 1..4, got '7'");
  expect_usage_error("stubs --level 0", "--level: expected a level 1..4, got '0'");
  expect_usage_error("profile --variant basline", "--variant: expected baseline, candidate or both, got 'basline'; "
                                                  "did you mean 'baseline'?");
}

TEST(CliUsage, RepeatedFlagMissingValueAndArgument) {
  expect_usage_error("eval --json a.json --json b.json", "--json: given 2 times; give it once");
  expect_usage_error("generate --json", "--json: needs a value");
  expect_usage_error("report", "kb_nano report: missing the files to read");
  expect_usage_error("generate --device cpu stray", "unexpected argument(s) 'stray'");
}

TEST(CliUsage, ExitCodes) {
  if (kbn::test::kb_nano().empty()) GTEST_SKIP() << "kb_nano is not built next to the tests";
  EXPECT_EQ(kb_nano("--help").code, 0);
  EXPECT_NE(kb_nano("--help").output.find("Exit codes: 0 success; 1 the run failed"), std::string::npos);
  EXPECT_EQ(kb_nano("list --level 1").code, 0);
  // A refused flag value (found while running) or input file is a usage error; a failed load is a failed run.
  EXPECT_EQ(kb_nano("generate --device cpu --model no-such-model").code, 2);
  EXPECT_EQ(kb_nano("report " KBN_SOURCE_DIR "/README.md").code, 2);
  EXPECT_EQ(kb_nano("generate --device cpu --model tiny-llama --weights /nonexistent_kbn/w.safetensors").code, 1);
}

TEST(CliUsage, ZeroAndNegativeValuesRefused) {
  expect_usage_error("generate --seed -1", "--seed: expected a seed 0..18446744073709551615, got '-1'");
  expect_usage_error("eval --seed -3", "--seed: expected a seed 0..18446744073709551615, got '-3'");
  expect_usage_error("kernels --random -1", "--random: expected an integer >= 0, got '-1'");
  expect_usage_error("kernels --seeds 0", "--seeds: expected an integer >= 1, got '0'");
  expect_usage_error("kernels --level 4", "--level: expected 1 (single kernels), 2 (blocks) or 3 (decoder layers)");
  expect_usage_error("eval --max-model-len 0", "--max-model-len: expected an integer >= 2, got '0'");
  expect_usage_error("eval --max-model-len -5", "--max-model-len: expected an integer >= 2, got '-5'");
  expect_usage_error("eval --max-num-batched-tokens -1", "--max-num-batched-tokens: expected an integer >= 0, got '-1'");
  expect_usage_error("eval --max-num-seqs 0", "--max-num-seqs: expected an integer >= 1, got '0'");
  expect_usage_error("eval --block-size 0", "--block-size: expected an integer >= 1, got '0'");
  expect_usage_error("eval --num-kv-blocks -2", "--num-kv-blocks: expected an integer >= 0, got '-2'");
  expect_usage_error("eval --gpu-memory-utilization 0", "--gpu-memory-utilization: expected a number > 0, got '0'");
  expect_usage_error("profile --launch-count 0", "--launch-count: expected an integer >= 1, got '0'");
}

TEST(CliUsage, VllmThroughputFlags) {
  expect_usage_error("eval --range-ratio 1.5", "--range-ratio: expected a fraction in [0, 1), got '1.5'");
  expect_usage_error("eval --input-len 0", "--input-len: expected an integer >= 1, got '0'");
  expect_usage_error("eval --num-prompts 0", "--num-prompts: expected an integer >= 1, got '0'");
  expect_usage_error("eval --workload balanced --input-len 64", "--workload excludes --input-len");
  expect_usage_error("eval --dataset d.jsonl --input-len 64", "--input-len excludes --dataset");
  if (kbn::test::kb_nano().empty()) return;
  const auto r = kb_nano("eval --device cpu --input-len 12 --output-len 3 --num-prompts 4");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("workload random (4 requests, 12 prompt / 3 output tokens, range ratio 0"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("4 requests: prompt 12..12 (mean 12.0), output 3..3"), std::string::npos) << r.output;
}

// kb_nano bench: llama-bench's tests and output formats on the tiny model.
TEST(CliUsage, BenchLikeLlamaBench) {
  expect_usage_error("bench -p 5,x", "-p: expected comma-separated token counts >= 0, got '5,x'");
  expect_usage_error("bench -p 0 -n 0", "-p and -n: every length is 0, so there is no test to run");
  expect_usage_error("bench -r 0", "--repetitions: expected an integer >= 1, got '0'");
  expect_usage_error("bench -o xml", "--output: expected md, csv or json, got 'xml'");
  expect_usage_error("bench --device cpu -p 5000", "-p/-n: a test needs 5001 positions, beyond tiny-llama's 2048");
  if (kbn::test::kb_nano().empty()) return;
  const auto j = kb_nano("bench --device cpu -p 16,32 -n 4 -r 2 -o json");
  ASSERT_EQ(j.code, 0) << j.output;
  const nlohmann::json d = nlohmann::json::parse(j.output.substr(j.output.find('{')));
  ASSERT_EQ(d["tests"].size(), 3u) << j.output;
  EXPECT_EQ(d["tests"][0]["test"], "pp16");
  EXPECT_EQ(d["tests"][1]["n_prompt"], 32);
  EXPECT_EQ(d["tests"][2]["test"], "tg4");
  EXPECT_EQ(d["tests"][2]["n_gen"], 4);
  for (const auto& t : d["tests"]) {
    EXPECT_EQ(t["samples_ts"].size(), 2u);
    EXPECT_GT(t["avg_ts"].get<double>(), 0);
  }
  EXPECT_EQ(d["model_n_params"], 164160);  // tiny-llama
  const auto md = kb_nano("bench --device cpu -p 8 -n 0 -r 1");
  EXPECT_NE(md.output.find("| model | size | params | backend | test | t/s |"), std::string::npos) << md.output;
  EXPECT_NE(md.output.find("| CPU kb-nano baseline eager | pp8 | "), std::string::npos) << md.output;
  const auto csv = kb_nano("bench --device cpu -p 0 -n 3 -r 1 -o csv");
  EXPECT_NE(csv.output.find("model,size_bytes,n_params,backend,test,n_prompt,n_gen,avg_ts,stddev_ts,commit\n"
                            "tiny-llama,656640,164160,CPU kb-nano baseline eager,tg3,0,3,"),
            std::string::npos)
      << csv.output;
}

TEST(CliUsage, DocumentedZeroDefaultsStillAccepted) {
  if (kbn::test::kb_nano().empty()) GTEST_SKIP() << "kb_nano is not built next to the tests";
  // The run stops at the (checked first) output path, after the command line was accepted.
  const auto r = kb_nano("eval --device cpu --num-requests 0 --scale 0 --max-num-batched-tokens 0 --num-kv-blocks 0 "
                         "--divergence-samples 0 --json /nonexistent_kbn/e.json");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--json: cannot write"), std::string::npos) << r.output;
  const std::string help = kb_nano("eval --help").output;
  for (const char* doc : {"0 = this default)", "0 = default)", "0 = off)"})
    EXPECT_NE(help.find(doc), std::string::npos) << doc << "\n" << help;
}

TEST(CliUsage, GeneratePastTheModelsPositionsRefusedUpFront) {
  // tiny-llama: max_position_embeddings 2048. Before this check the rotary op refused position 2048 mid-run.
  expect_usage_error("generate --device cpu --model tiny-llama --prompt-ids 1,2,3 --max-new-tokens 2046",
                     "--max-new-tokens: prompt 0 (3 tokens) + 2046 new tokens = 2049 positions, beyond tiny-llama's "
                     "limit of 2048 (max_position_embeddings in");
  expect_usage_error("generate --device cpu --model tiny-llama --prompt-ids 1,2,3 --max-new-tokens 2046",
                     "at most 2045 new tokens fit after this prompt");
  if (kbn::test::kb_nano().empty()) return;
  // Exactly at the limit runs (on CPU, a 2048-token generation of the tiny model takes a few seconds: use a long
  // prompt instead).
  std::string ids = "1";
  for (int i = 1; i < 2040; ++i) ids += ",1";
  const auto r = kb_nano("generate --device cpu --model tiny-llama --prompt-ids " + ids + " --max-new-tokens 8");
  EXPECT_EQ(r.code, 0) << r.output.substr(0, 2000);
}

TEST(CliUsage, KernelsUnknownTargetListsTheRequestedLevel) {
  if (kbn::test::kb_nano().empty()) GTEST_SKIP() << "kb_nano is not built next to the tests";
  const std::string base = "kernels --device cpu --model tiny-llama --list --target nope --level ";
  const auto l1 = kb_nano(base + "1"), l3 = kb_nano(base + "3");
  EXPECT_EQ(l1.code, 2) << l1.output;
  EXPECT_NE(l1.output.find("--target: 'nope' is not a benchmarked op. Level 1 (single kernels) has: argmax"),
            std::string::npos)
      << l1.output;
  EXPECT_EQ(l1.output.find("llama_decoder_layer"), std::string::npos) << "level 1 lists level 3's ops\n" << l1.output;
  EXPECT_NE(l3.output.find("Level 3 (decoder layers) has: deepseek_v2_decoder_layer, gemma3_decoder_layer"),
            std::string::npos)
      << l3.output;
  EXPECT_EQ(l3.output.find("rms_norm"), std::string::npos) << "level 3 lists level 1's ops\n" << l3.output;
  for (const auto& r : {l1, l3})
    EXPECT_NE(r.output.find("Levels with benchmarked ops: 1 (single kernels, "), std::string::npos) << r.output;
  expect_usage_error("kernels --device cpu --model tiny-llama --list --target rms_nrom",
                     "'rms_nrom' is not a benchmarked op; did you mean 'rms_norm'?");
}

TEST(CliUsage, StubsWriteIntoTheCheckoutOfTheWorkingDirectory) {
  namespace fs = std::filesystem;
  const std::string exe = kbn::test::kb_nano();
  if (exe.empty()) GTEST_SKIP() << "kb_nano is not built next to the tests";
  // A second checkout: what `stubs` reads (tasks/baseline/) and what marks a checkout root (CMakeLists.txt).
  const fs::path root = kbn::test::temp_dir("kbn_stubs_checkout");
  fs::create_directories(root / "tasks" / "baseline" / "L1");
  fs::create_directories(root / "deeper" / "still");
  for (const char* f : {"rms_norm.h", "rms_norm.cu"})
    fs::copy_file(fs::path(KBN_SOURCE_DIR) / "tasks" / "baseline" / "L1" / f, root / "tasks" / "baseline" / "L1" / f);
  std::ofstream(root / "CMakeLists.txt") << "# a checkout\n";
  const fs::path built_tree_stub = fs::path(KBN_SOURCE_DIR) / "tasks" / "candidate" / "L1" / "rms_norm.h";
  const bool built_tree_had_stub = fs::exists(built_tree_stub);

  const auto r = kbn::test::shell("cd " + (root / "deeper" / "still").string() + " && env -u KBN_SOURCE_DIR " + exe +
                                  " stubs --target rms_norm");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(root / "tasks" / "candidate" / "L1" / "rms_norm.h")) << r.output;
  EXPECT_TRUE(fs::exists(root / "tasks" / "candidate" / "L1" / "rms_norm.cu")) << r.output;
  EXPECT_NE(r.output.find("Candidate stubs in " + (root / "tasks" / "candidate").string()), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("Rebuild kb_nano before they take effect"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("this kb_nano was built from " KBN_SOURCE_DIR ", not from " + root.string()),
            std::string::npos)
      << r.output;
  if (!built_tree_had_stub) {
    EXPECT_FALSE(fs::exists(built_tree_stub)) << "stubs wrote into the build's source tree";
  }

  // Outside any checkout: refused, nothing written anywhere.
  const fs::path elsewhere = kbn::test::temp_dir("kbn_stubs_elsewhere");
  const auto e = kbn::test::shell("cd " + elsewhere.string() + " && env -u KBN_SOURCE_DIR " + exe +
                                  " stubs --target rms_norm");
  EXPECT_NE(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("is not inside a kb-nano checkout"), std::string::npos) << e.output;
  if (!built_tree_had_stub) {
    EXPECT_FALSE(fs::exists(built_tree_stub)) << "stubs wrote into the build's source tree";
  }
  fs::remove_all(root);
  fs::remove_all(elsewhere);
}

TEST(CliUsage, VersionNamesTheBuildAndTheGpuCode) {
  if (kbn::test::kb_nano().empty()) {
    GTEST_SKIP() << "kb_nano is not built next to the tests";
  }
  const auto r = kb_nano("--version");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("kb_nano ", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("CUDA: "), std::string::npos) << r.output;
#ifdef KBN_WITH_CUDA
  EXPECT_NE(r.output.find("-gencode"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("GPU"), std::string::npos) << r.output;
#endif
}

// --csv, and the rerun command as the last column of --markdown's tables.
TEST(CliUsage, KernelsWritesCsv) {
  if (kbn::test::kb_nano().empty()) {
    GTEST_SKIP() << "kb_nano is not built next to the tests";
  }
  const std::filesystem::path dir = kbn::test::temp_dir("kbn_kernels_csv");
  const std::string csv = (dir / "k.csv").string();
  const std::string md = (dir / "k.md").string();
  const auto r = kb_nano("kernels --device cpu --model tiny-llama --target rms_norm --tokens 3 --random 0 --seeds 1 "
                         "--csv " + csv + " --markdown " + md);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream md_in(md);
  const std::string md_text((std::istreambuf_iterator<char>(md_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(md_text.find("| why | rerun |"), std::string::npos) << md_text;
  EXPECT_NE(md_text.find("| `kb_nano kernels --target rms_norm --model tiny-llama"), std::string::npos) << md_text;
  std::ifstream in(csv);
  std::string head, row, extra;
  ASSERT_TRUE(std::getline(in, head)) << "empty CSV";
  EXPECT_EQ(head.rfind("op,model,tp,case,tokens,dtype,mode,verdict,check,baseline_median_us,", 0), 0u) << head;
  EXPECT_NE(head.find(",why,rerun"), std::string::npos) << head;
  ASSERT_TRUE(std::getline(in, row)) << "no case row";
  EXPECT_EQ(row.rfind("rms_norm,tiny-llama,1,T=3 H=64,3,", 0), 0u) << row;
  EXPECT_NE(row.find(",PASS,"), std::string::npos) << row;
  EXPECT_NE(row.find("kb_nano kernels --target rms_norm"), std::string::npos) << row;
  EXPECT_EQ(std::count(head.begin(), head.end(), ','), std::count(row.begin(), row.end(), ',')) << head << "\n" << row;
  EXPECT_FALSE(std::getline(in, extra)) << "one case, one row: " << extra;
  std::filesystem::remove_all(dir);
}

TEST(CliUsage, EvalWritesCsv) {
  if (kbn::test::kb_nano().empty()) {
    GTEST_SKIP() << "kb_nano is not built next to the tests";
  }
  const std::filesystem::path dir = kbn::test::temp_dir("kbn_eval_csv");
  const std::string csv = (dir / "e.csv").string();
  const auto r = kb_nano("eval --device cpu --model tiny-llama --workload latency-b1 --num-requests 2 --variant "
                         "baseline --csv " + csv);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(csv);
  std::string head, row, extra;
  ASSERT_TRUE(std::getline(in, head)) << "empty CSV";
  EXPECT_EQ(head.rfind("model,workload,mode,variant,num_requests,prompt_tokens,output_tokens,duration_s,", 0), 0u)
      << head;
  EXPECT_NE(head.find(",tpot_p99_ms,"), std::string::npos) << head;
  ASSERT_TRUE(std::getline(in, row)) << "no variant row";
  EXPECT_EQ(row.rfind("tiny-llama,latency-b1,eager,baseline,2,", 0), 0u) << row;
  EXPECT_EQ(std::count(head.begin(), head.end(), ','), std::count(row.begin(), row.end(), ',')) << head << "\n" << row;
  EXPECT_FALSE(std::getline(in, extra)) << "one variant, one row: " << extra;
  std::filesystem::remove_all(dir);
}
