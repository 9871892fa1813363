#include "megatron/checkpoint/conversion_command.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <functional>
#include <set>

#include "megatron/core/error.h"
#include "megatron/core/quoted_bytes.h"

namespace megatron::checkpoint {
namespace {

// One option of a spelling: whether it takes a value, and what it does with it.
struct Option {
  std::string name;
  bool takes_value = true;
  std::function<void(const std::string& value)> apply;
};

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// Applies `options` to `args` (flags as "--name value" or "--name=value"); appends problems.
void parse_options(const std::vector<std::string>& args, const std::vector<Option>& options,
                   std::vector<std::string>& problems) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i], value;
    bool inline_value = false;
    if (const size_t eq = name.find('='); name.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      inline_value = true;
    }
    auto it = std::find_if(options.begin(), options.end(), [&](const Option& o) { return o.name == name; });
    if (it == options.end()) {
      std::string nearest;
      size_t best = SIZE_MAX;
      for (const Option& o : options)
        if (size_t d = edit_distance(name, o.name); d < best) best = d, nearest = o.name;
      problems.push_back(str_cat("unknown ", name.rfind("--", 0) == 0 ? "flag " : "argument ", name,
                                 best <= std::max<size_t>(3, name.size() / 3) ? str_cat("; did you mean ", nearest, "?") : ""));
      while (!inline_value && i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) ++i;  // its values
      continue;
    }
    if (it->takes_value && !inline_value) {
      if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0) {
        problems.push_back(str_cat(name, " needs a value"));
        continue;
      }
      value = args[++i];
    }
    if (!it->takes_value && inline_value) {
      problems.push_back(str_cat(name, " is a switch and takes no value"));
      continue;
    }
    try {
      it->apply(value);
    } catch (const Error& e) {
      problems.push_back(e.what());
    }
  }
}

// A parallel size: a positive integer that fits an int (strtol saturates on overflow, which int() would wrap).
int parse_size(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(value.c_str(), &end, 10);
  MEGATRON_CHECK(!value.empty() && end == value.c_str() + value.size() && errno == 0 && v > 0 && v <= INT_MAX, flag,
                 " ", quoted_bytes(value), " must be a positive integer");
  return int(v);
}

Option noted(ConversionRequest& r, std::string name, bool takes_value, std::string why) {
  return {name, takes_value, [&r, name, why](const std::string& v) {
            r.notes.push_back(str_cat(name, v.empty() ? "" : " " + v, ": accepted, changes nothing here (", why, ")"));
          }};
}

Option refused(std::string name, bool takes_value, std::string why) {
  return {name, takes_value, [name, why](const std::string& v) { MEGATRON_FAIL(name, v.empty() ? "" : " " + v, ": ", why); }};
}

// --bf16 / --torch-dtype / --dtype: the weights' dtype after conversion.
void set_dtype(ConversionRequest& r, const std::string& flag, const std::string& value) {
  if (value == "bf16" || value == "bfloat16") r.dtype = DType::BF16;
  else if (value == "fp32" || value == "float32") r.dtype = DType::F32;
  else MEGATRON_FAIL(flag, " '", value, "': weights convert to bf16 or fp32 here (fp16 is not offered); use bfloat16 or float32");
}

void require(const ConversionRequest& r, const std::string& what, const std::string& value, std::vector<std::string>& problems) {
  if (value.empty()) problems.push_back(str_cat(what, " is required (", r.spelling, " spelling)"));
}

ConversionRequest native_spelling(const std::vector<std::string>& args, std::vector<std::string>& problems) {
  ConversionRequest r;
  r.spelling = "native";
  std::string direction;
  parse_options(args,
                {{"--direction", true, [&](const std::string& v) { direction = v; }},
                 {"--load-dir", true, [&](const std::string& v) { r.load_dir = v; }},
                 {"--save-dir", true, [&](const std::string& v) { r.save_dir = v; }},
                 {"--target-tensor-parallel-size", true,
                  [&](const std::string& v) { r.tensor_parallel_size = parse_size("--target-tensor-parallel-size", v); }},
                 {"--target-pipeline-parallel-size", true,
                  [&](const std::string& v) { r.pipeline_parallel_size = parse_size("--target-pipeline-parallel-size", v); }},
                 {"--hf-model-type", true, [&](const std::string& v) { r.family = parse_hf_family(v); }},
                 {"--dtype", true, [&](const std::string& v) { set_dtype(r, "--dtype", v); }}},
                problems);
  if (direction != "hf-to-megatron" && direction != "megatron-to-hf")
    problems.push_back(str_cat("--direction ", quoted_bytes(direction), " must be hf-to-megatron or megatron-to-hf"));
  r.import = direction == "hf-to-megatron";
  require(r, "--load-dir", r.load_dir, problems);
  require(r, "--save-dir", r.save_dir, problems);
  return r;
}

// A convert.py loader or saver: true for a Hugging Face directory, false for our checkpoint.
bool is_hf_plugin(const std::string& flag, const std::string& name) {
  static const std::set<std::string> hf = {"llama_mistral", "loader_llama_mistral", "saver_llama_mistral", "mixtral",
                                           "mixtral_hf",    "loader_mixtral_hf",    "saver_mixtral_hf",    "hf"};
  static const std::set<std::string> ours = {"megatron", "mcore", "core", "legacy", "loader_core", "saver_core"};
  if (hf.count(name)) return true;
  MEGATRON_CHECK(ours.count(name), flag, " '", name, "' is not one this tool has: Hugging Face llama_mistral, mixtral_hf "
                 "(mixtral) or hf; ours megatron (mcore, core, legacy)");
  return false;
}

std::optional<HfFamily> family_of_model_size(const std::string& size) {
  if (size == "mistral") return HfFamily::Mistral;
  if (size == "qwen2.5") return HfFamily::Qwen2;
  static const std::set<std::string> llama = {"llama2-7B",  "llama2-13B",  "llama2-70B", "llama2-7Bf",
                                              "llama2-13Bf", "llama2-70Bf", "llama3",     "yi-34B"};
  MEGATRON_CHECK(llama.count(size), "--model-size '", size, "' is not one of llama2-7B, llama2-13B, llama2-70B, "
                 "llama2-7Bf, llama2-13Bf, llama2-70Bf, llama3, mistral, yi-34B, qwen2.5");
  return HfFamily::Llama;
}

ConversionRequest convert_py_spelling(const std::vector<std::string>& args, std::vector<std::string>& problems) {
  ConversionRequest r;
  r.spelling = "convert.py";
  std::string model_type, loader = "megatron", saver = "megatron", model_size;
  const char* layout_free = "our checkpoints are layout-free: any TP/PP/EP loads them";
  std::vector<Option> options = {
      {"--model-type", true, [&](const std::string& v) { model_type = v; }},
      {"--loader", true, [&](const std::string& v) { loader = v; }},
      {"--saver", true, [&](const std::string& v) { saver = v; }},
      {"--load-dir", true, [&](const std::string& v) { r.load_dir = v; }},
      {"--save-dir", true, [&](const std::string& v) { r.save_dir = v; }},
      {"--target-tensor-parallel-size", true,
       [&](const std::string& v) { r.tensor_parallel_size = parse_size("--target-tensor-parallel-size", v); }},
      {"--target-pipeline-parallel-size", true,
       [&](const std::string& v) { r.pipeline_parallel_size = parse_size("--target-pipeline-parallel-size", v); }},
      {"--model-size", true, [&](const std::string& v) { model_size = v, r.family = family_of_model_size(v); }},
      {"--checkpoint-type", true,
       [&](const std::string& v) {
         MEGATRON_CHECK(v == "hf", "--checkpoint-type '", v, "': Meta's original format is not read here; convert it to "
                        "Hugging Face's first (transformers' convert_llama_weights_to_hf) and pass --checkpoint-type hf");
       }},
      {"--bf16", false, [&](const std::string&) { r.dtype = DType::BF16; }},
      refused("--fp16", false, "weights convert to bf16 or fp32 here; use --bf16 (or neither: keep the stored dtype)"),
      {"--make-vocab-size-divisible-by", true,
       [&](const std::string& v) {
         MEGATRON_CHECK(parse_size("--make-vocab-size-divisible-by", v) == 128, "--make-vocab-size-divisible-by ", v,
                        ": the import pads the vocabulary to Megatron's default multiple, 128 x TP; leave the flag out");
       }},
      refused("--true-vocab-size", true, "the vocabulary is the Hugging Face config's vocab_size (padding rows are added "
              "on import and dropped on export); leave the flag out"),
      noted(r, "--target-expert-parallel-size", true, layout_free),
      noted(r, "--tokenizer-model", true, "tokenizer files are not converted: pass them to --tokenizer-* when training"),
      noted(r, "--vocab-file", true, "the vocabulary size comes from config.json"),
      noted(r, "--megatron-path", true, "no Megatron-LM sources are needed"),
      noted(r, "--max-queue-size", true, "the conversion runs in one process"),
      noted(r, "--no-checking", false, "names and order are always checked"),
      noted(r, "--loader-transformer-impl", true, "one implementation"),
      noted(r, "--saver-transformer-impl", true, "one implementation"),
      noted(r, "--position-embedding-type", true, "read from the checkpoint's arguments"),
  };
  parse_options(args, options, problems);
  if (model_type != "GPT")
    problems.push_back(str_cat("--model-type '", model_type, "': only GPT models convert here (give --model-type GPT)"));
  try {
    const bool from_hf = is_hf_plugin("--loader", loader), to_hf = is_hf_plugin("--saver", saver);
    if (from_hf == to_hf)
      problems.push_back(str_cat("--loader ", loader, " --saver ", saver, ": one side must be Hugging Face and the other ",
                                 "ours (", from_hf ? "Hugging Face to Hugging Face is not a conversion" : layout_free,
                                 "; copy the directory instead)"));
    r.import = from_hf;
    if (to_hf && (saver == "mixtral" || saver == "mixtral_hf" || saver == "saver_mixtral_hf")) r.family = HfFamily::Mixtral;
    if (from_hf && !model_size.empty()) r.family.reset();  // the import reads the family from config.json
  } catch (const Error& e) {
    problems.push_back(e.what());
  }
  require(r, "--load-dir", r.load_dir, problems);
  require(r, "--save-dir", r.save_dir, problems);
  return r;
}

ConversionRequest bridge_spelling(const std::vector<std::string>& args, std::vector<std::string>& problems) {
  ConversionRequest r;
  r.spelling = "bridge";
  r.import = args.front() == "import";
  std::string source, destination;
  auto size = [&](const char* flag, int& out) {
    return Option{flag, true, [&out, flag](const std::string& v) { out = parse_size(flag, v); }};
  };
  int unused = 1;
  std::vector<Option> options = {
      size("--tp", r.tensor_parallel_size), size("--tensor-parallel-size", r.tensor_parallel_size),
      size("--pp", r.pipeline_parallel_size), size("--pipeline-parallel-size", r.pipeline_parallel_size),
      size("--ep", unused), size("--expert-parallel-size", unused), size("--etp", unused),
      size("--expert-tensor-parallel-size", unused),
      {"--torch-dtype", true, [&](const std::string& v) { set_dtype(r, "--torch-dtype", v); }},
      noted(r, "--trust-remote-code", false, "no model code is run"),
      noted(r, "--device", true, "the conversion runs on the CPU"),
      noted(r, "--executor", true, "the conversion runs in this process"),
      noted(r, "--overwrite", false, "the destination's checkpoint is replaced"),
      noted(r, "--distributed-timeout-minutes", true, "one process"),
      noted(r, "--hf-revision", true, "local directories only"),
  };
  if (r.import) {
    options.push_back({"--hf-model-path", true, [&](const std::string& v) { source = v; }});
    options.push_back({"--hf-model", true, [&](const std::string& v) { source = v; }});
    options.push_back({"--output-path", true, [&](const std::string& v) { destination = v; }});
    options.push_back({"--megatron-path", true, [&](const std::string& v) { destination = v; }});
    options.push_back(noted(r, "--low-memory-save", false, "tensors are written one by one"));
  } else {
    options.push_back({"--checkpoint-path", true, [&](const std::string& v) { source = v; }});
    options.push_back({"--megatron-path", true, [&](const std::string& v) { source = v; }});
    options.push_back({"--output-path", true, [&](const std::string& v) { destination = v; }});
    options.push_back({"--hf-path", true, [&](const std::string& v) { destination = v; }});
    options.push_back({"--export-weight-dtype", true, [&](const std::string& v) { set_dtype(r, "--export-weight-dtype", v); }});
    options.push_back(noted(r, "--hf-model", true, "the checkpoint keeps the imported config.json and family"));
    for (const char* f : {"--no-progress", "--not-strict"}) options.push_back(noted(r, f, false, "nothing to switch"));
    options.push_back(noted(r, "--distributed-save", false, "one process writes"));
    options.push_back(noted(r, "--save-every-n-ranks", true, "one process writes"));
  }
  parse_options(std::vector<std::string>(args.begin() + 1, args.end()), options, problems);
  r.load_dir = source;
  r.save_dir = destination;
  require(r, r.import ? "--hf-model-path (or --hf-model)" : "--checkpoint-path (or --megatron-path)", source, problems);
  require(r, r.import ? "--output-path (or --megatron-path)" : "--output-path (or --hf-path)", destination, problems);
  return r;
}

}  // namespace

ConversionRequest parse_conversion_command(const std::vector<std::string>& args) {
  std::vector<std::string> problems;
  ConversionRequest r;
  const bool bridge = !args.empty() && (args.front() == "import" || args.front() == "export");
  const bool convert_py = std::any_of(args.begin(), args.end(), [](const std::string& a) {
    return a == "--model-type" || a == "--loader" || a == "--saver" || a.rfind("--model-type=", 0) == 0;
  });
  if (bridge) r = bridge_spelling(args, problems);
  else if (convert_py) r = convert_py_spelling(args, problems);
  else r = native_spelling(args, problems);
  if (!problems.empty()) {
    std::string text = str_cat("invalid ", r.spelling, " command line (", problems.size(),
                               problems.size() == 1 ? " problem" : " problems", "):");
    for (const std::string& p : problems) text += "\n  - " + p;
    throw Error(text + "\n" + conversion_usage());
  }
  return r;
}

std::string conversion_usage() {
  return "usage: convert_checkpoint --direction hf-to-megatron|megatron-to-hf --load-dir DIR --save-dir DIR\n"
         "                          [--target-tensor-parallel-size N] [--target-pipeline-parallel-size P]\n"
         "                          [--hf-model-type llama|mistral|qwen2|qwen3|mixtral|qwen2_moe|qwen3_moe|gpt2] [--dtype bf16|fp32]\n"
         "   or (Megatron-LM's convert.py): convert_checkpoint --model-type GPT --loader llama_mistral|mixtral_hf|megatron\n"
         "                          --saver megatron|llama_mistral|mixtral --load-dir DIR --save-dir DIR\n"
         "                          [--target-tensor-parallel-size N] [--target-pipeline-parallel-size P]\n"
         "                          [--checkpoint-type hf] [--model-size M] [--tokenizer-model F] [--bf16]\n"
         "   or (Megatron Bridge): convert_checkpoint import --hf-model-path DIR --output-path DIR [--tp N] [--pp P]\n"
         "                         convert_checkpoint export --checkpoint-path DIR --output-path DIR\n";
}

}  // namespace megatron::checkpoint
