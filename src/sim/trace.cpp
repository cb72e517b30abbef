// write_chrome_trace(): the simulated timeline as Chrome trace-event JSON, one process
// per rank and one thread per lane (compute, send, recv, collective), times in us.
#include <fmt/format.h>

#include <array>
#include <nlohmann/json.hpp>
#include <ostream>

#include "ballast/simulator.hpp"

namespace ballast {

namespace {

constexpr std::array<const char*, 4> kLanes = {"compute", "send", "recv", "collective"};
constexpr double kMicrosecondsPerSecond = 1e6;

int lane_id(const std::string& lane) {
  for (std::size_t i = 0; i < kLanes.size(); ++i) {
    if (lane == kLanes[i]) return static_cast<int>(i);
  }
  return static_cast<int>(kLanes.size()) - 1;
}

nlohmann::json metadata(int rank, int tid, const char* what, const std::string& name) {
  return {{"name", what}, {"ph", "M"}, {"pid", rank}, {"tid", tid}, {"args", {{"name", name}}}};
}

}  // namespace

void write_chrome_trace(const SimulationReport& report, std::ostream& out) {
  nlohmann::json events = nlohmann::json::array();
  const int gpus_per_node = std::max(1, report.gpus_per_node);
  for (int rank = 0; rank < static_cast<int>(report.ranks.size()); ++rank) {
    events.push_back(metadata(rank, 0, "process_name",
                              fmt::format("rank {} (node {})", rank, rank / gpus_per_node)));
    events.push_back({{"name", "process_sort_index"},
                      {"ph", "M"},
                      {"pid", rank},
                      {"tid", 0},
                      {"args", {{"sort_index", rank}}}});
    for (std::size_t lane = 0; lane < kLanes.size(); ++lane) {
      events.push_back(metadata(rank, static_cast<int>(lane), "thread_name", kLanes[lane]));
    }
  }
  for (const TraceEvent& event : report.trace) {
    nlohmann::json args = {{"micro_batch", event.micro_batch}};
    if (!event.category.empty()) args["category"] = event.category;
    events.push_back({{"name", event.name},
                      {"cat", event.lane},
                      {"ph", "X"},
                      {"pid", event.rank},
                      {"tid", lane_id(event.lane)},
                      {"ts", event.start_s * kMicrosecondsPerSecond},
                      {"dur", event.duration_s * kMicrosecondsPerSecond},
                      {"args", std::move(args)}});
  }
  const nlohmann::json trace = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  out << trace.dump() << '\n';
}

}  // namespace ballast
