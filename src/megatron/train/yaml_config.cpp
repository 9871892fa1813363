#include "megatron/train/yaml_config.h"

#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "megatron/core/error.h"
#include "megatron/train/flags.h"

#if MEGATRON_WITH_YAML
#include <yaml-cpp/yaml.h>
#endif

namespace megatron::train {

#if MEGATRON_WITH_YAML
namespace {

// TransformerConfig / ModelParallelConfig field names whose flag has another name.
const std::map<std::string, std::string>& renames() {
  static const std::map<std::string, std::string> r = {
      {"layernorm_epsilon", "norm_epsilon"},       {"num_moe_experts", "num_experts"},
      {"fp8", "fp8_format"},                       {"layernorm_zero_centered_gamma", "apply_layernorm_1p"},
      {"moe_router_topk_scaling_factor", "moe_router_topk_scaling_factor"}};
  return r;
}

// Keys without a flag here that Megatron's example configuration sets to a value which changes nothing in this
// implementation (its default, a fusion on, initialisation on, ...): accepted when they hold exactly that value.
const std::map<std::string, std::string>& harmless_defaults() {
  static const std::map<std::string, std::string> d = {
      {"perform_initialization", "true"},  {"clone_scatter_output_in_embedding", "true"},
      {"batch_p2p_comm", "true"},          {"batch_p2p_sync", "true"},
      {"barrier_with_L1_time", "true"},    {"cpu_offloading_activations", "true"},
      {"tp_comm_split_ag", "true"},        {"tp_comm_split_rs", "true"},
      {"tp_comm_atomic_ag", "true"},       {"tp_comm_atomic_rs", "true"},
      {"tp_comm_bulk_wgrad", "true"},      {"tp_comm_bulk_dgrad", "true"},
      {"bert_binary_head", "true"},
      {"fp8_interval", "1"},               {"cpu_offloading_num_layers", "0"},
      {"sample_rate", "1.0"},              {"mask_prob", "0.15"},
      {"short_seq_prob", "0.1"},           {"vocab_extra_ids", "0"},
      {"align_grad_reduce", "true"},       {"manual_gc_eval", "true"},
      {"enable_one_logger", "true"},       {"one_logger_project", "megatron-lm"},
      {"adlr_autoresume_interval", "1000"}, {"min_loss_scale", "1.0"},
      {"loss_scale_window", "1000"},       {"hysteresis", "2"},
      {"sgd_momentum", "0.9"},             {"optimizer", "adam"},
      {"timing_log_option", "minmax"},     {"timing_log_level", "0"},
      {"tensorboard_log_interval", "1"},   {"tensorboard_queue_size", "1000"},
      {"log_loss_scale_to_tensorboard", "true"}, {"log_params_norm", "true"},
      {"log_num_zeros_in_grad", "true"},   {"wandb_project", ""},
      {"wandb_exp_name", ""},              {"wandb_save_dir", ""},
      {"spec", ""},                        {"transformer_impl", "local"},
      {"params_dtype", ""},                {"use_legacy_models", "false"},
      {"data_parallel_random_init", "false"}, {"distributed_backend", "nccl"},
      {"apply_rope_fusion", "true"},
  };
  return d;
}

std::string expand_environment(const std::string& text, const std::string& key) {
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t open = text.find("${", pos);
    if (open == std::string::npos) break;
    const size_t close = text.find('}', open);
    if (close == std::string::npos) break;
    const std::string name = text.substr(open + 2, close - open - 2);
    const char* value = std::getenv(name.c_str());
    MEGATRON_CHECK(value != nullptr, "--yaml-cfg: ", key, ": environment variable ", name, " is not set");
    out += text.substr(pos, open - pos) + value;
    pos = close + 1;
  }
  return out + text.substr(pos);
}

struct Converter {
  std::map<std::string, FlagStatusRow> flags;
  std::vector<std::string> argv, problems;

  bool known(const std::string& flag) const { return flags.count(flag) != 0; }

  void scalar(const std::string& key, const YAML::Node& node) {
    std::string name = key;
    if (auto it = renames().find(key); it != renames().end()) name = it->second;
    std::string flag = "--" + name;
    for (char& c : flag) c = c == '_' ? '-' : c;
    std::string text = node.IsNull() ? "" : expand_environment(node.as<std::string>(), key);
    const bool is_bool = node.IsScalar() && (text == "true" || text == "false" || text == "True" || text == "False");
    const bool truth = text == "true" || text == "True";
    if (is_bool) text = truth ? "true" : "false";  // YAML 1.1 spells them True/False too
    if (node.IsNull() || text.empty()) return;  // not given
    if (key == "activation_func") {
      if (text == "swiglu") argv.push_back("--swiglu");
      else if (text != "gelu") problems.push_back(str_cat("activation_func: ", text, " (only gelu and swiglu here)"));
      return;
    }
    if (key == "gated_linear_unit" || key == "add_bias_linear" || key == "fp8_wgrad" || key == "add_position_embedding") {
      if (key == "add_bias_linear" && !truth) argv.push_back("--disable-bias-linear");
      if (key == "fp8_wgrad" && !truth) argv.push_back("--no-fp8-wgrad");
      if (key == "add_position_embedding" && !truth) argv.push_back("--no-position-embedding");
      return;  // gated_linear_unit: the gated MLP comes with activation_func swiglu
    }
    if (known(flag)) {
      const FlagStatusRow& f = flags.at(flag);
      if (!f.takes_value) {
        if (!is_bool) problems.push_back(str_cat(key, ": ", text, " (", flag, " is a switch: give true or false)"));
        else if (truth) argv.push_back(flag);
        return;
      }
      argv.push_back(flag);
      argv.push_back(text);
      return;
    }
    for (const char* prefix : {"--no-", "--disable-"}) {  // Megatron's store_false arguments
      const std::string negated = prefix + flag.substr(2);
      if (known(negated) && is_bool) {
        if (!truth) argv.push_back(negated);
        return;
      }
    }
    const auto harmless = harmless_defaults().find(key);
    if ((is_bool && !truth) || (harmless != harmless_defaults().end() && harmless->second == text)) return;
    problems.push_back(str_cat(key, ": ", text, " (no such setting here; only null, false or Megatron's default are "
                                                "accepted for it)"));
  }

  void list(const std::string& key, const YAML::Node& node) {
    std::string flag = "--" + key;
    for (char& c : flag) c = c == '_' ? '-' : c;
    if (!known(flag)) {
      if (node.size() > 0) problems.push_back(str_cat(key, ": a list, but there is no ", flag, " here"));
      return;
    }
    if (node.size() == 0) return;
    argv.push_back(flag);
    for (const YAML::Node& v : node) argv.push_back(expand_environment(v.as<std::string>(), key));
  }

  void section(const YAML::Node& map, bool top) {
    for (const auto& kv : map) {
      const std::string key = kv.first.as<std::string>();
      if (top && (key == "language_model" || key == "model_parallel") && kv.second.IsMap()) {
        section(kv.second, false);
        continue;
      }
      if (key == "yaml_cfg") continue;
      try {
        if (kv.second.IsSequence()) list(key, kv.second);
        else if (kv.second.IsMap()) problems.push_back(str_cat(key, ": a section, but only language_model and model_parallel are"));
        else scalar(key, kv.second);
      } catch (const YAML::Exception& e) {
        problems.push_back(str_cat(key, ": ", e.what()));
      } catch (const Error& e) {
        problems.push_back(e.what());
      }
    }
  }
};

}  // namespace

bool yaml_config_available() { return true; }

std::vector<std::string> yaml_config_flags(const std::string& path) {
  // yaml-cpp's reader dies (std::terminate) on a stream that fails while it reads, as a directory's does: only
  // a regular file (or a link to one) is handed to it.
  std::error_code error;
  MEGATRON_CHECK(std::filesystem::is_regular_file(path, error), "--yaml-cfg ", path, ": ",
                 std::filesystem::exists(path, error) ? "not a regular file" : "no such file");
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    MEGATRON_FAIL("--yaml-cfg ", path, ": cannot read the file");
  } catch (const YAML::Exception& e) {
    MEGATRON_FAIL("--yaml-cfg ", path, ": not valid YAML: ", e.what());
  }
  MEGATRON_CHECK(root.IsMap(), "--yaml-cfg ", path, ": the top level must be a mapping of argument names");
  Converter c;
  for (const FlagStatusRow& row : flag_statuses()) c.flags[row.name] = row;
  c.section(root, true);
  if (!c.problems.empty()) {
    std::string text = str_cat("--yaml-cfg ", path, ": ", c.problems.size(), " key(s) this build cannot honour:");
    for (const std::string& p : c.problems) text += "\n  - " + p;
    throw Error(text);
  }
  return c.argv;
}

#else

bool yaml_config_available() { return false; }

std::vector<std::string> yaml_config_flags(const std::string& path) {
  MEGATRON_FAIL("--yaml-cfg ", path, ": this build has no YAML reader (install libyaml-cpp-dev and reconfigure), or give "
                "the settings as flags");
}

#endif

}  // namespace megatron::train
