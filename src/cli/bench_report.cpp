// The benchmarks' JSON report: see bench_report.h.
#include "cli/bench_report.h"

#include <cstdio>
#include <fstream>

namespace lily::cli {

void add_report_options(CLI::App& app, ReportArgs& r) {
  app.add_option("--json", r.json_out, "Also write the JSON to this file");
  app.add_option("--label", r.label, "Free text recorded in the JSON (commit, notes)");
}

nlohmann::json report_head(const Model& model, const ReportArgs& r) {
  nlohmann::json out;
  out["backend"] = model.backend_name();
  out["hardware"] = model.hardware();
  out["model"] = model.dir();
  out["label"] = r.label;
  return out;
}

void print_report(const nlohmann::json& report, const ReportArgs& r) {
  const std::string text = report.dump(1);
  if (!r.json_out.empty()) std::ofstream(r.json_out) << text << "\n";
  std::printf("%s\n", text.c_str());
}

}  // namespace lily::cli
