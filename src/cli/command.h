// Subcommand registry: each src/cli/cmd_*.cpp registers itself with a static Registrar, so a
// new subcommand is one new file. setup() adds the options to its CLI11 sub-app and returns the
// function that runs it (exit code).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace lily::cli {

using RunFn = std::function<int()>;
using SetupFn = std::function<RunFn(CLI::App&)>;

struct Command {
  std::string name;
  std::string help;
  SetupFn setup;
};

std::vector<Command>& commands();

struct Registrar {
  Registrar(std::string name, std::string help, SetupFn setup) {
    commands().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

}  // namespace lily::cli
