// The trace schema's writers (trace.hpp): Chrome trace-event JSON, one process per rank
// and one thread per lane, times in us; and the compact JSON list ranks exchange.
#include "ballast/trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <nlohmann/json.hpp>
#include <ostream>

#include "ballast/error.hpp"

namespace ballast {

namespace {

constexpr double kMicrosecondsPerSecond = 1e6;
constexpr int kLaneCount = static_cast<int>(std::size(kTraceLanes));

nlohmann::json metadata(int rank, int tid, const char* what, const std::string& name) {
  return {{"name", what}, {"ph", "M"}, {"pid", rank}, {"tid", tid}, {"args", {{"name", name}}}};
}

}  // namespace

int trace_lane_index(const std::string& lane) {
  for (int i = 0; i < kLaneCount; ++i) {
    if (lane == kTraceLanes[i]) return i;
  }
  return kLaneCount - 1;
}

void write_chrome_trace(std::span<const TraceEvent> events, int ranks, int gpus_per_node,
                        std::ostream& out, int tensor_parallel) {
  const TraceTimeline timeline{"", events};
  write_chrome_trace(std::span<const TraceTimeline>(&timeline, 1), ranks, gpus_per_node, out,
                     tensor_parallel);
}

void write_chrome_trace(std::span<const TraceTimeline> timelines, int ranks, int gpus_per_node,
                        std::ostream& out, int tensor_parallel) {
  nlohmann::json json_events = nlohmann::json::array();
  gpus_per_node = std::max(1, gpus_per_node);
  for (std::size_t t = 0; t < timelines.size(); ++t) {
    const std::string prefix = timelines[t].label.empty() ? "" : timelines[t].label + " ";
    for (int rank = 0; rank < ranks; ++rank) {
      const int pid = static_cast<int>(t) * ranks + rank;
      const int node = rank / gpus_per_node;
      const std::string process =
          tensor_parallel > 1
              ? fmt::format("{}TP group {} (GPUs {}-{}, node {})", prefix, rank,
                            rank * tensor_parallel, rank * tensor_parallel + tensor_parallel - 1,
                            node)
              : fmt::format("{}rank {} (node {})", prefix, rank, node);
      json_events.push_back(metadata(pid, 0, "process_name", process));
      json_events.push_back({{"name", "process_sort_index"},
                             {"ph", "M"},
                             {"pid", pid},
                             {"tid", 0},
                             {"args", {{"sort_index", pid}}}});
      for (int lane = 0; lane < kLaneCount; ++lane) {
        json_events.push_back(metadata(pid, lane, "thread_name", kTraceLanes[lane]));
      }
    }
  }
  for (std::size_t t = 0; t < timelines.size(); ++t) {
    for (const TraceEvent& event : timelines[t].events) {
      nlohmann::json args = {{"micro_batch", event.micro_batch}};
      if (!event.category.empty()) args["category"] = event.category;
      json_events.push_back({{"name", event.name},
                             {"cat", event.lane},
                             {"ph", "X"},
                             {"pid", static_cast<int>(t) * ranks + event.rank},
                             {"tid", trace_lane_index(event.lane)},
                             {"ts", event.start_s * kMicrosecondsPerSecond},
                             {"dur", event.duration_s * kMicrosecondsPerSecond},
                             {"args", std::move(args)}});
    }
  }
  const nlohmann::json trace = {{"traceEvents", std::move(json_events)}, {"displayTimeUnit", "ms"}};
  out << trace.dump() << '\n';
}

std::string trace_events_to_json(std::span<const TraceEvent> events) {
  nlohmann::json list = nlohmann::json::array();
  for (const TraceEvent& event : events) {
    list.push_back({event.rank, event.lane, event.name, event.micro_batch, event.start_s,
                    event.duration_s, event.category});
  }
  return list.dump();
}

std::vector<TraceEvent> trace_events_from_json(const std::string& text) {
  std::vector<TraceEvent> events;
  try {
    for (const nlohmann::json& item : nlohmann::json::parse(text)) {
      events.push_back({item.at(0).get<int>(), item.at(1).get<std::string>(),
                        item.at(2).get<std::string>(), item.at(3).get<int>(),
                        item.at(4).get<double>(), item.at(5).get<double>(),
                        item.at(6).get<std::string>()});
    }
  } catch (const nlohmann::json::exception& error) {
    throw InputError(fmt::format("not a list of trace events: {}", error.what()));
  }
  return events;
}

}  // namespace ballast
