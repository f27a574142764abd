// The JSON report of `lily bench` and `bench-batch`: the same head (backend, hardware, checkpoint,
// --label) and the same ending (printed on stdout, and written to --json FILE when given).
#pragma once
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "model/model.h"

namespace lily::cli {

struct ReportArgs {
  std::string json_out;  // --json: also written here
  std::string label;     // --label: free text recorded in the report
};

// --json and --label.
void add_report_options(CLI::App& app, ReportArgs& r);

// A report's first fields: backend, hardware, model (its directory), label.
nlohmann::json report_head(const Model& model, const ReportArgs& r);

// On stdout, and into --json's file when given.
void print_report(const nlohmann::json& report, const ReportArgs& r);

}  // namespace lily::cli
