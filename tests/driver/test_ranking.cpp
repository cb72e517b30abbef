// rank_strategies (`ballast run --strategy A,B,...`): strategies measured against predicted.
// A strategy without a prediction has no predicted figure (never a 0) and stays out of the
// correlation and the order; its measured figure stands.
#include <gtest/gtest.h>

#include "ballast/driver/run.hpp"

namespace ballast::driver {
namespace {

/// One step, ranks busy for `busy_s`; predicted `predicted_s` per rank, or no prediction.
RunReport run_of(const std::string& strategy, std::vector<double> busy_s, std::vector<double> predicted_s) {
  RunReport run;
  run.strategy = strategy;
  StepReport step;
  for (double busy : busy_s) step.ranks.push_back({.busy_s = busy});
  step.predicted_busy_s = std::move(predicted_s);
  if (step.predicted_busy_s.empty()) step.prediction_note = "the plan does not fit the host calibration";
  run.steps.push_back(step);
  return run;
}

TEST(RankStrategies, AStrategyWithoutAPredictionHasNoPredictedFigure) {
  const std::vector<RunReport> runs = {run_of("a", {1.0, 2.0}, {1.1, 2.1}), run_of("b", {3.0, 0.5}, {}),
                                       run_of("c", {4.0, 1.0}, {4.2, 1.0})};
  const StrategyRanking ranking = rank_strategies(runs);
  ASSERT_EQ(ranking.strategies.size(), 3u);
  EXPECT_EQ(ranking.measured_busiest_s, (std::vector<double>{2.0, 3.0, 4.0}));  // b's measured stands
  ASSERT_TRUE(ranking.predicted_busiest_s[0].has_value());
  EXPECT_DOUBLE_EQ(*ranking.predicted_busiest_s[0], 2.1);
  EXPECT_FALSE(ranking.predicted_busiest_s[1].has_value());  // not 0
  EXPECT_EQ(ranking.notes[1], "the plan does not fit the host calibration");
  EXPECT_TRUE(ranking.notes[0].empty());
  // a and c agree in order; b (a 0 in place of its prediction would be out of order) is left out.
  EXPECT_TRUE(ranking.disagreements.empty());
  EXPECT_DOUBLE_EQ(ranking.rank_correlation, 1.0);
}

TEST(RankStrategies, OrderOverThePredictedOnes) {
  const std::vector<RunReport> runs = {run_of("a", {1.0}, {2.0}), run_of("b", {2.0}, {1.0})};
  const StrategyRanking ranking = rank_strategies(runs);
  EXPECT_EQ(ranking.disagreements, (std::vector<std::string>{"a/b"}));
  EXPECT_DOUBLE_EQ(ranking.rank_correlation, -1.0);
}

}  // namespace
}  // namespace ballast::driver
