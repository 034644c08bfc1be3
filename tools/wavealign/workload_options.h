// Options shared by subcommands that build a workload: a synthetic video-DiT mask or a mask file.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "checks.h"
#include "wavealign/enums.h"
#include "wavealign/mask.h"
#include "wavealign/skip_profile.h"
#include "wavealign/workload.h"

namespace wavealign::cli {

struct WorkloadOptions {
  std::string model = "wan2.1-14b";
  int frames = 161;
  int heads = 2;
  std::string mask = "video";  // random | video | path to a .npy file
  double density = 0.28;
  int block = 0;  // 0 = the default block of the command (the GPU preset's in simulate, else 128)
  uint64_t seed = 0;
};

struct Workload {
  BlockMask mask;
  int64_t tokens = 0;
  int block = 128;
  nlohmann::json description;  // the "workload" object of --json output
};

void add_workload_options(CLI::App& command, WorkloadOptions& options);
/// --block (an integer >= 1; the command checks 64 or 128) and --seed (an unsigned 64-bit integer), shared by the
/// subcommands that take them.
void add_block_option(CLI::App& command, int& block, const std::string& help);
void add_seed_option(CLI::App& command, uint64_t& seed, const std::string& help);
/// --wave-size (an integer >= 0; 0 = the GPU's slots) and --iterations (Stage 1's, in [1, 1000]).
void add_wave_size_option(CLI::App& command, int& wave_size);
void add_iterations_option(CLI::App& command, int& iterations);
/// --plan-reuse: a finite number > 0, the attention calls that share one plan.
void add_plan_reuse_option(CLI::App& command, double& plan_reuse, const std::string& help);

/// --profile: the skip profile, by the library's rule (skip_profile_choice): not given = the built-in profile of
/// --gpu, "none", a GPU preset's name, or a profile file.
void add_profile_option(CLI::App& command, std::string& profile, const std::string& help);
/// The --profile value resolved and loaded (choose_skip_profile); errors name "--profile", with the file and the
/// field in the message.
SkipProfileChoice profile_option(const std::string& value, GpuPreset gpu);

/// The shape of the synthetic workload (--mask random or video), checked, before anything is generated: what
/// `generate` sizes its output by. Throws InvalidArgument naming the flag.
struct SyntheticShape {
  VideoShape video;
  int heads = 0;
  int block = 128;
  int q_blocks = 0;
  int kv_blocks = 0;
};
SyntheticShape synthetic_shape(const WorkloadOptions& options, int default_block = 128);

/// A bool/uint8 .npy mask file (the --mask option) with no empty dimension: throws InvalidArgument naming the
/// file for a malformed file and "--mask" for a zero heads, query-block or KV-block count.
BlockMask load_mask_file(const std::string& path);
/// Generates or loads the mask; throws InvalidArgument naming the flag on bad values. default_block replaces
/// a block of 0.
Workload make_workload(const WorkloadOptions& options, int default_block = 128);

/// Parses a comma-separated enum list, e.g. "original,s1,wavealign"; errors name `flag`.
template <class E>
std::vector<E> parse_enum_list(std::string_view flag, const std::string& text) {
  std::vector<E> values;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    values.push_back(enum_flag<E>(flag, text.substr(begin, end - begin)));
    begin = end + 1;
  }
  return values;
}

}  // namespace wavealign::cli
