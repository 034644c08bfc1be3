// Subcommands of the wavealign CLI. Each registers its options on a CLI11 subcommand and returns the
// function that runs it (exit status 0 on success).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace wavealign::cli {

using Runner = std::function<int()>;

Runner add_simulate(CLI::App& app);
Runner add_reorder(CLI::App& app);
Runner add_viz(CLI::App& app);
Runner add_generate(CLI::App& app);
Runner add_skip(CLI::App& app);
Runner add_mask(CLI::App& app);
Runner add_bench(CLI::App& app);

}  // namespace wavealign::cli
