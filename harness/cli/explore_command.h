// `dmpcheck explore`'s command line (its own file: main.cc holds the commands that share flags).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "explore/explore.h"

namespace dmpcheck::cli {

struct ExploreFlags {
  explore::ExploreOptions options;
  std::string budget = "20m";
};

CLI::App* add_explore_command(CLI::App& app, ExploreFlags& flags);

// Runs it: the budget read ("90", "90s", "20m", "1h"), the output folder made.
int command_explore(ExploreFlags& flags, const std::string& worker_executable);

}  // namespace dmpcheck::cli
