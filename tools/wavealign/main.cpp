// wavealign: cache-aware query-row scheduling for block-sparse attention, from the command line.
// Exit status: 0 success, 2 bad arguments or input (the message names it), 1 any other failure.
#include <CLI/CLI.hpp>

#include <iostream>

#include "commands.h"
#include "progress.h"
#include "wavealign/error.h"

int main(int argc, char** argv) {
  CLI::App app{"wavealign: reorder block-sparse attention rows for L2 locality, and predict the effect"};
  app.require_subcommand(1);
  // Flags a subcommand does not know go to the top level, so --quiet works before or after the subcommand.
  app.fallthrough();
  bool quiet = false;
  app.add_flag("-q,--quiet", quiet, "no progress line on stderr (shown for work over 2 s when stderr is a terminal)");
  std::vector<std::pair<CLI::App*, wavealign::cli::Runner>> commands;
  for (auto add : {wavealign::cli::add_simulate, wavealign::cli::add_reorder, wavealign::cli::add_viz,
                   wavealign::cli::add_generate, wavealign::cli::add_skip, wavealign::cli::add_mask,
                   wavealign::cli::add_bench}) {
    auto runner = add(app);
    commands.emplace_back(app.get_subcommands({}).back(), std::move(runner));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    return app.exit(help);
  } catch (const CLI::CallForAllHelp& help) {
    return app.exit(help);
  } catch (const CLI::ParseError& error) {
    app.exit(error);
    return 2;
  }
  wavealign::cli::set_quiet(quiet);
  try {
    for (auto& [command, runner] : commands)
      if (command->parsed()) return runner();
  } catch (const wavealign::InvalidArgument& error) {
    std::cerr << "wavealign: " << error.what() << std::endl;
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "wavealign: " << error.what() << std::endl;
    return 1;
  }
  return 1;
}
