// The task graph's event-driven run on random graphs: progressive filling by a scan over a
// component's ports (the fast path for small components) gives the same timeline, to the
// bit, as the heap (the reference), and the default split between them does too; and a
// thread's reused buffers (each graph and run takes the last ones' capacity) change nothing;
// and run_until's stops on the tasks' paths keep its contract.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "timeline.hpp"

namespace ballast::sim {
namespace {

/// A random graph on `port_count` ports: compute, transfers on one to three ports (a few
/// ports shared by many, so components range from one transfer to most of the graph),
/// collectives holding up to six ports, joins, and dependencies with and without delays.
TaskGraph random_graph(std::mt19937_64& rng, int port_count) {
  TaskGraph graph(/*keep_names=*/false);
  const auto uniform = [&](int low, int high) {
    return std::uniform_int_distribution<int>(low, high)(rng);
  };
  const auto seconds = [&](double high) { return std::uniform_real_distribution<double>(0, high)(rng); };
  const auto name = [] { return std::string(); };
  // Most transfers draw from a few busy ports, so components grow past any scan limit.
  const int busy_ports = uniform(1, std::min(port_count, 6));
  const auto port = [&] { return uniform(0, 3) == 0 ? uniform(0, busy_ports - 1) : uniform(0, port_count - 1); };
  // One to `most` distinct ports (at most every port).
  const auto distinct_ports = [&](int most) {
    std::vector<int> ports;
    const int count = uniform(1, std::min(most, port_count));
    while (static_cast<int>(ports.size()) < count) {
      const int p = port();
      if (std::find(ports.begin(), ports.end(), p) == ports.end()) ports.push_back(p);
    }
    return ports;
  };
  const int tasks = uniform(100, 500);
  for (int id = 0; id < tasks; ++id) {
    const auto dep = [&] { return id == 0 || uniform(0, 3) == 0 ? -1 : uniform(std::max(0, id - 40), id - 1); };
    const int kind = uniform(0, 19);
    int added = -1;
    if (kind < 6) {
      added = graph.add_compute(uniform(0, 15), 0, seconds(1e-3), {dep(), dep()}, name);
    } else if (kind < 17) {
      const std::vector<int> ports = distinct_ports(3);
      const Seconds duration_s = uniform(0, 9) == 0 ? 0.0 : seconds(2e-3);
      added = graph.add_transfer(uniform(0, 15), uniform(0, 15), 0, duration_s, seconds(1e-4), ports,
                                 {dep(), dep()}, name);
    } else if (kind < 19) {
      std::vector<int> ports = distinct_ports(6);
      std::sort(ports.begin(), ports.end());
      const std::vector<int> members = {uniform(0, 7), uniform(8, 15)};
      const std::vector<int> deps = {dep(), dep()};
      std::vector<int> real;
      for (int d : deps) {
        if (d >= 0) real.push_back(d);
      }
      added = graph.add_collective(members, 0, seconds(1e-3), ports, real, name);
    } else {
      const std::vector<int> deps = {dep(), dep(), dep()};
      added = graph.add_join(deps);
    }
    if (added >= 0 && added == id && uniform(0, 4) == 0) {
      const int delayed = dep();
      if (delayed >= 0) graph.depend(added, delayed, seconds(5e-4));
    }
    if (added != id && graph.size() <= id) {
      // add_join returned an existing task or none: keep ids dense with a compute task.
      graph.add_compute(0, 0, seconds(1e-4), {}, name);
    }
  }
  return graph;
}

TEST(TaskGraphRandom, ScanningAndTheHeapGiveTheSameTimelineToTheBit) {
  int compared = 0;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    std::mt19937_64 rng(seed);
    const int port_count = std::uniform_int_distribution<int>(2, 96)(rng);
    const TaskGraph graph = random_graph(rng, port_count);
    TaskGraph by_heap = graph, by_scan = graph, by_default = graph;
    by_heap.set_scanned_component_ports(0);
    by_scan.set_scanned_component_ports(std::numeric_limits<std::size_t>::max());
    by_heap.run(port_count);
    by_scan.run(port_count);
    by_default.run(port_count);
    for (int id = 0; id < graph.size(); ++id) {
      SCOPED_TRACE(::testing::Message() << "seed " << seed << ", task " << id);
      ASSERT_EQ(by_scan.task(id).start_s, by_heap.task(id).start_s);
      ASSERT_EQ(by_scan.task(id).end_s, by_heap.task(id).end_s);
      ASSERT_EQ(by_default.task(id).end_s, by_heap.task(id).end_s);
      ++compared;
    }
    // Stopped early, each way stops at the same clock.
    TaskGraph until_heap = graph, until_scan = graph;
    until_heap.set_scanned_component_ports(0);
    until_scan.set_scanned_component_ports(std::numeric_limits<std::size_t>::max());
    Seconds step_s = 0;
    for (int id = 0; id < graph.size(); ++id) step_s = std::max(step_s, by_heap.task(id).end_s);
    EXPECT_EQ(until_scan.run_until(port_count, step_s / 2), until_heap.run_until(port_count, step_s / 2));
  }
  EXPECT_GT(compared, 60 * 100);
}

/// Every task's (start, end) after a run of `graph` (a copy: the caller's stays unrun).
std::vector<std::pair<Seconds, Seconds>> timeline(TaskGraph graph, int port_count, Seconds stop_at_s) {
  graph.run_until(port_count, stop_at_s);
  std::vector<std::pair<Seconds, Seconds>> out;
  for (int id = 0; id < graph.size(); ++id) out.emplace_back(graph.task(id).start_s, graph.task(id).end_s);
  return out;
}

TEST(TaskGraphRandom, ReusedBuffersGiveTheSameTimelineToTheBit) {
  // Graphs of different sizes, built and run one after another on this thread, so each
  // takes buffers the previous ones left (larger or smaller, holding stale values); the
  // reference runs each on a thread of its own, whose first graph starts from nothing.
  constexpr int kGraphs = 12;
  std::vector<int> ports(kGraphs);
  std::vector<std::vector<std::pair<Seconds, Seconds>>> reused(kGraphs), fresh(kGraphs);
  const auto run_one = [&ports](int g, bool stop_early) {
    std::mt19937_64 rng(1000 + static_cast<std::uint64_t>(g));
    const int port_count = std::uniform_int_distribution<int>(2, 96)(rng);
    const TaskGraph graph = random_graph(rng, port_count);
    ports[g] = port_count;
    return timeline(graph, port_count, stop_early ? 1e-3 : std::numeric_limits<Seconds>::infinity());
  };
  for (int g = 0; g < kGraphs; ++g) {
    if (g == kGraphs / 2) release_spare_buffers();  // what simulate() does after its report
    reused[g] = run_one(g, g % 3 == 2);
  }
  for (int g = 0; g < kGraphs; ++g) {
    std::thread([&, g] { fresh[g] = run_one(g, g % 3 == 2); }).join();
  }
  for (int g = 0; g < kGraphs; ++g) {
    SCOPED_TRACE(::testing::Message() << "graph " << g << " on " << ports[g] << " ports");
    ASSERT_FALSE(fresh[g].empty());
    EXPECT_EQ(reused[g], fresh[g]);
  }
}

TEST(TaskGraph, LongestPathIsTheStepOfAGraphWithoutContention) {
  // A compute task (1 s), a transfer after it (2 s alone, 0.5 s of it latency) and a
  // collective on other ports after the transfer with a 0.25 s delay (3 s): 6.25 s on the
  // longest path, which nothing shares, so the run takes exactly that; a join and a
  // shorter branch (a 4 s compute from the start) change neither.
  TaskGraph graph(/*keep_names=*/false);
  const auto name = [] { return std::string(); };
  const int first = graph.add_compute(0, 0, 1.0, {}, name);
  EXPECT_EQ(graph.longest_path_s(), 1.0);
  const int ports_a[] = {0, 1};
  const int transfer = graph.add_transfer(0, 1, 0, 2.0, 0.5, ports_a, {first}, name);
  EXPECT_EQ(graph.longest_path_s(), 3.0);
  const int members[] = {0, 1};
  const int ports_b[] = {2, 3};
  const int none[] = {-1};
  const int collective = graph.add_collective(members, 0, 3.0, ports_b, none, name);
  graph.depend(collective, transfer, 0.25);
  EXPECT_EQ(graph.longest_path_s(), 6.25);
  const int side = graph.add_compute(1, 0, 4.0, {}, name);
  const int ends[] = {collective, side};
  graph.add_join(ends);
  EXPECT_EQ(graph.longest_path_s(), 6.25);
  TaskGraph run = graph;
  EXPECT_EQ(run.run_until(4, std::numeric_limits<Seconds>::infinity()), 6.25);
  // A stop the path passes answers without a run, at least the stop, at most the step.
  TaskGraph stopped = graph;
  const Seconds answer_s = stopped.run_until(4, 5.0);
  EXPECT_GE(answer_s, 5.0);
  EXPECT_LE(answer_s, 6.25);
  EXPECT_GT(answer_s, 6.2);  // the path's, not the stop's
}

TEST(TaskGraphRandom, PathStopsKeepRunUntilsContract) {
  // run_until() with the path stops (no run when the longest path reaches the stop, or a
  // stop once a started task's path does) against the run without them (the reference):
  // below the stop both give the step to the bit; at or past it both give a lower bound
  // of the step that is at least the stop.
  const std::int64_t stops_before = path_stop_count();
  int exact = 0, bounded = 0;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    std::mt19937_64 rng(500 + seed);
    const int port_count = std::uniform_int_distribution<int>(2, 96)(rng);
    const TaskGraph graph = random_graph(rng, port_count);
    TaskGraph full = graph;
    full.run(port_count);
    Seconds step_s = 0;
    for (int id = 0; id < graph.size(); ++id) step_s = std::max(step_s, full.task(id).end_s);
    ASSERT_LE(graph.longest_path_s(), step_s * (1 + 1e-12));  // a lower bound of the step
    for (const double fraction : {0.1, 0.5, 0.8, 0.95, 0.999, 1.0, 1.001, 1.2}) {
      SCOPED_TRACE(::testing::Message() << "seed " << seed << ", stop at " << fraction << " of the step");
      const Seconds stop_at_s = fraction * step_s;
      TaskGraph with_paths = graph, without = graph;
      without.set_path_stop(false);
      const Seconds with_s = with_paths.run_until(port_count, stop_at_s);
      const Seconds without_s = without.run_until(port_count, stop_at_s);
      if (step_s < stop_at_s) {
        ASSERT_EQ(with_s, step_s);
        ASSERT_EQ(without_s, step_s);
        ++exact;
      } else {
        ASSERT_GE(with_s, stop_at_s);
        ASSERT_LE(with_s, step_s);
        ASSERT_GE(without_s, stop_at_s);
        ++bounded;
      }
    }
  }
  EXPECT_GT(exact, 60);
  EXPECT_GT(bounded, 5 * 60);
  // Not vacuous: the paths stopped runs (with no run or midway).
  EXPECT_GT(path_stop_count() - stops_before, 60);
}

}  // namespace
}  // namespace ballast::sim
