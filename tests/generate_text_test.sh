#!/usr/bin/env bash
# kb_nano generate with text in and out (issue 21), on the CPU with tiny Llama: prompt text (argument and stdin),
# --ids, a batch, --chat, sampling flags, warm/cold labels and the errors a user meets first.
# Usage: generate_text_test.sh <kb_nano> <source dir>
set -uo pipefail
kbn=$1
src=$2
fail() { echo "FAIL: $*" >&2; exit 1; }
# The checkpoint fixture (fixed weights) with the tiny models' tokenizer.
ck=(--device cpu --model "$src/tests/fixtures/tiny-llama" --tokenizer "$src/models/tokenizers/tiny-llama.json")

out=$("$kbn" generate --device cpu --prompt "Hello world" --max-new-tokens 8 2>err.txt) || fail "plain prompt: $(cat err.txt)"
echo "$out"
[[ "$out" == "Hello world"* ]] || fail "the prompt is not echoed first: '$out'"
grep -q "cold: the first pass" err.txt || fail "the CPU timing is not labelled cold: $(cat err.txt)"

out_stdin=$(printf 'Hello world' | "$kbn" generate --device cpu --prompt - --max-new-tokens 8 2>/dev/null) || fail "stdin"
[[ "$out_stdin" == "$out" ]] || fail "stdin gave '$out_stdin', the argument '$out'"

ids=$("$kbn" generate --device cpu --prompt "Hello world" --max-new-tokens 8 --ids 2>/dev/null | sed -n 1p) || fail "--ids"
echo "$ids"
[[ "$ids" =~ ^prompt\ 0\ \(([0-9]+)\ tokens\)\ -\>\ [0-9]+(,[0-9]+){7}$ ]] || fail "--ids printed '$ids'"

batch=$("$kbn" generate "${ck[@]}" --prompt "The cat" --prompt "def main():" --max-new-tokens 4 2>/dev/null) || fail "batch"
echo "$batch"
[[ $(grep -c '^\[0\] The cat' <<<"$batch") == 1 && $(grep -c '^\[1\] def main():' <<<"$batch") == 1 ]] ||
  fail "a batch of two prompts printed '$batch'"

# Greedy does not depend on the sampling seed; sampling does, and one seed gives one text.
g1=$("$kbn" generate "${ck[@]}" --prompt "Once upon a time" --max-new-tokens 16 --seed 1 --ids 2>/dev/null | sed -n 1p)
g2=$("$kbn" generate "${ck[@]}" --prompt "Once upon a time" --max-new-tokens 16 --seed 2 --ids 2>/dev/null | sed -n 1p)
[[ -n "$g1" && "$g1" == "$g2" ]] || fail "greedy tokens changed with --seed: '$g1' vs '$g2'"
s1=$("$kbn" generate "${ck[@]}" --prompt "Once upon a time" --max-new-tokens 16 --temperature 1 --seed 1 --ids 2>/dev/null | sed -n 1p)
s1b=$("$kbn" generate "${ck[@]}" --prompt "Once upon a time" --max-new-tokens 16 --temperature 1 --seed 1 --ids 2>/dev/null | sed -n 1p)
s2=$("$kbn" generate "${ck[@]}" --prompt "Once upon a time" --max-new-tokens 16 --temperature 1 --seed 2 --ids 2>/dev/null | sed -n 1p)
echo "greedy $g1"; echo "seed 1 $s1"; echo "seed 2 $s2"
[[ -n "$s1" && "$s1" == "$s1b" ]] || fail "one seed sampled two outputs: '$s1' vs '$s1b'"
[[ "$s1" != "$s2" && "$s1" != "$g1" ]] || fail "sampling did not change the tokens: '$s1', '$s2', greedy '$g1'"
k1=$("$kbn" generate "${ck[@]}" --prompt "Once upon a time" --max-new-tokens 16 --temperature 1 --top-k 1 --seed 5 --ids 2>/dev/null | sed -n 1p)
[[ "$k1" == "$g1" ]] || fail "--top-k 1 is not greedy: '$k1' vs '$g1'"

chat=$("$kbn" generate "${ck[@]}" --chat --system "Be brief." --prompt " Hi " --max-new-tokens 4 2>err.txt) ||
  fail "--chat: $(cat err.txt)"
want=$'<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n'
[[ "$chat" == "$want"* ]] || fail "--chat echoed '$chat'"
grep -q "chat format: llama3" err.txt || fail "--chat does not say which format: $(cat err.txt)"

expect_error() {  # <exit code> <text the message must hold> <args...>
  local code=$1 text=$2
  shift 2
  "$kbn" generate "$@" >/dev/null 2>err.txt
  local rc=$?
  [[ $rc == "$code" ]] || fail "'$*' exited $rc, expected $code: $(cat err.txt)"
  grep -qF -- "$text" err.txt || fail "'$*' said '$(cat err.txt)', expected it to hold '$text'"
}
expect_error 2 "needs a tokenizer" --device cpu --model tiny-qwen3 --prompt "hi"
expect_error 2 "--tokenizer: '/nonexistent.json' is not a file" --device cpu --prompt hi --tokenizer /nonexistent.json
expect_error 2 "--system: only with --chat" --device cpu --prompt hi --system x
expect_error 2 "give one or the other" --device cpu --prompt hi --prompt-ids 1,2
expect_error 2 "the prompt is empty" --device cpu --prompt ""
expect_error 2 "--top-p" --device cpu --prompt hi --top-p 1.5
expect_error 2 "--temperature" --device cpu --prompt hi --temperature -1
# A config whose architecture no L4 serves is named before any of its keys are read.
sed 's/"LlamaForCausalLM"/"FalconForCausalLM"/' "$src/models/tiny-llama.json" >unserved-arch.json
expect_error 1 "no L4 model serves architecture 'FalconForCausalLM'" --device cpu --model ./unserved-arch.json
# kb_nano tokenize: the ids Hugging Face gives for "Hello world" with Llama-3's tokenizer, and back.
lb="$src/tests/fixtures/tokenizers/llama-bpe/tokenizer.json"
ids=$("$kbn" tokenize --tokenizer "$lb" --text "Hello world" --json 2>/dev/null) || fail "tokenize"
[[ "$ids" == "[128000,9906,1917]" ]] || fail "tokenize gave $ids"
back=$("$kbn" tokenize --tokenizer "$lb" --decode 128000,9906,1917 --no-special 2>/dev/null) || fail "tokenize --decode"
[[ "$back" == "Hello world" ]] || fail "tokenize --decode gave '$back'"
expect_tokenize_error() { "$kbn" tokenize "$@" >/dev/null 2>err.txt && fail "tokenize $* succeeded"; grep -q -- "--" err.txt || fail "tokenize $*: $(cat err.txt)"; }
expect_tokenize_error --tokenizer "$lb" --decode 1,x
expect_tokenize_error --tokenizer "$lb" --text a --decode 1
echo "generate_text_test: ok"
