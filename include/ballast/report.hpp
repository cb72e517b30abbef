// Reports of single simulations: text, CSV and JSON forms of SimulationReport.
#pragma once

#include <iosfwd>
#include <vector>

#include <nlohmann/json.hpp>

#include "ballast/plan.hpp"
#include "ballast/simulator.hpp"

namespace ballast {

/// JSON of one simulated step (schema in docs/cli.md), per-rank figures included.
nlohmann::ordered_json report_to_json(const SimulationReport& report);
/// Summary and the busiest `max_rank_rows` ranks as a table.
void write_report_text(const SimulationReport& report, const Cluster& cluster, std::ostream& out,
                       int max_rank_rows = 8);
/// One row per rank: step,rank,node,busy_s,communication_s,exposed_communication_s,idle_s,peak_memory_bytes
void write_report_csv_header(std::ostream& out);
void write_report_csv_rows(const SimulationReport& report, std::int64_t step,
                           const Cluster& cluster, std::ostream& out);

}  // namespace ballast
