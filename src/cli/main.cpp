// lily: the command-line entry point. Subcommands live in cmd_*.cpp (see command.h).
#include <algorithm>
#include <cstdio>
#include <map>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli/command.h"

namespace lily::cli {
std::vector<Command>& commands() {
  static std::vector<Command> cmds;
  return cmds;
}
}  // namespace lily::cli

int main(int argc, char** argv) {
  using namespace lily::cli;
  // Logs go to stderr so stdout carries only a command's output (e.g. `generate --json`).
  spdlog::set_default_logger(spdlog::stderr_color_mt("lily"));
  CLI::App app{"lily: an inference server for Qwen3.6-35B-A3B (MLX 4-bit)"};
  app.require_subcommand(1);
  auto& cmds = commands();
  std::sort(cmds.begin(), cmds.end(), [](const Command& a, const Command& b) { return a.name < b.name; });
  std::map<CLI::App*, RunFn> runs;
  for (auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    runs[sub] = c.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, run] : runs)
    if (sub->parsed()) return run();
  return 1;
}
