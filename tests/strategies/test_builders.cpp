// Tests of the shared strategy building blocks: packing, chunking, capacities, degree
// selection and the registry.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "ballast/error.hpp"
#include "ballast/strategy.hpp"
#include "builders.hpp"
#include "fake_cost.hpp"

namespace ballast::strategies {
namespace {

using testing::error_of;
using testing::FakeCostModel;
using testing::tiny_cluster;
using testing::tiny_model;

TEST(Registry, ListsStrategiesInOrder) {
  const std::vector<std::string> expected = {"packed-dp",           "static-cp",
                                             "static-cp-allgather", "static-ulysses",
                                             "batch-adaptive",      "hybrid-dp",
                                             "flexsp",              "flexsp-fast", "zeppelin",
                                             "ballast"};
  EXPECT_EQ(planner_names(), expected);
  EXPECT_EQ(find_planner("hybrid-dp").name(), "hybrid-dp");
  for (const auto& planner : planners()) EXPECT_FALSE(planner->description().empty());
}

TEST(Registry, UnknownNameListsKnownOnes) {
  EXPECT_THROW(find_planner("zeppelin-x"), InputError);
  EXPECT_EQ(error_of([] { find_planner("x"); }),
            "unknown strategy 'x'; known: packed-dp, static-cp, static-cp-allgather, "
            "static-ulysses, batch-adaptive, hybrid-dp, flexsp, flexsp-fast, zeppelin, "
            "ballast");
}

TEST(StrategySpec, NameAndParameters) {
  const StrategySpec plain = parse_strategy_spec("hybrid-dp");
  EXPECT_EQ(plain.planner->name(), "hybrid-dp");
  EXPECT_FALSE(plain.options.degree);
  PlannerOptions base;
  base.degree = 4;
  const StrategySpec fixed = parse_strategy_spec("static-ulysses:degree=32", base);
  EXPECT_EQ(fixed.text, "static-ulysses:degree=32");
  EXPECT_EQ(fixed.planner->name(), "static-ulysses");
  EXPECT_EQ(fixed.options.degree, 32);  // the spec overrides --degree
  EXPECT_EQ(parse_strategy_spec("static-cp", base).options.degree, 4);
}

TEST(StrategySpec, CommonDegreeGoesOnlyToFixedDegreeStrategies) {
  // --degree 8 with every strategy (`compare --degree 8`) used to stop the whole comparison
  // on zeppelin, whose hierarchical partition picks each sequence's ring.
  PlannerOptions base;
  base.degree = 8;
  EXPECT_EQ(parse_strategy_spec("static-cp", base).options.degree, 8);
  EXPECT_EQ(parse_strategy_spec("static-ulysses", base).options.degree, 8);
  EXPECT_EQ(parse_strategy_spec("batch-adaptive", base).options.degree, 8);
  EXPECT_EQ(parse_strategy_spec("zeppelin:partition=even", base).options.degree, 8);
  EXPECT_FALSE(parse_strategy_spec("zeppelin", base).options.degree);
  EXPECT_FALSE(parse_strategy_spec("zeppelin:routing=off", base).options.degree);
  EXPECT_FALSE(parse_strategy_spec("hybrid-dp", base).options.degree);
  EXPECT_FALSE(parse_strategy_spec("flexsp-fast", base).options.degree);
  // A degree in the spec itself is still judged by the strategy.
  EXPECT_NE(error_of([&] { parse_strategy_spec("zeppelin:degree=8", base); }).find("partition=even"),
            std::string::npos);
}

TEST(StrategySpec, BadSpecsNameTheFix) {
  EXPECT_EQ(error_of([] { parse_strategy_spec("static-ulysses:deg=8"); }),
            "strategy 'static-ulysses:deg=8': unknown parameter 'deg' (did you mean 'degree'?); "
            "static-ulysses takes degree, packing, pad");
  EXPECT_EQ(error_of([] { parse_strategy_spec("hybrid-dp:degree=8"); }),
            "strategy 'hybrid-dp:degree=8': unknown parameter 'degree'; hybrid-dp takes no "
            "parameters");
  EXPECT_EQ(error_of([] { parse_strategy_spec("static-cp:degree"); }),
            "strategy 'static-cp:degree': parameter 'degree' is not key=value; write "
            "name:key=value[:key=value] (static-cp takes degree)");
  EXPECT_EQ(error_of([] { parse_strategy_spec("static-cp:degree=2:degree=4"); }),
            "strategy 'static-cp:degree=2:degree=4': parameter 'degree' given twice");
  EXPECT_EQ(error_of([] { parse_strategy_spec("static-cp:degree=-2"); }),
            "strategy 'static-cp:degree=-2': degree=-2 is neither a fixed degree (an integer "
            "from 1 to 1048576) nor per-step (the degree of each step's longest sequence)");
  EXPECT_THROW(parse_strategy_spec("nope:degree=2"), InputError);
  EXPECT_THROW(parse_strategy_spec("static-cp:"), InputError);
}

TEST(Helpers, PowersOfTwoAndCounts) {
  EXPECT_TRUE(is_power_of_two(1));
  EXPECT_TRUE(is_power_of_two(64));
  EXPECT_FALSE(is_power_of_two(0));
  EXPECT_FALSE(is_power_of_two(24));
  EXPECT_EQ(next_power_of_two(1), 1);
  EXPECT_EQ(next_power_of_two(5), 8);
  EXPECT_EQ(next_power_of_two(8), 8);
  EXPECT_EQ(with_thousands(300000), "300,000");
  EXPECT_EQ(with_thousands(999), "999");
  EXPECT_EQ(with_thousands(1234567), "1,234,567");
}

TEST(BestFitDecreasing, HandChecked) {
  // Sorted: 7(2) 5(0) 4(4) 3(1) 2(3) 1(5). 7 -> A (room 3); 5 -> B (5); 4 -> B (1);
  // 3 -> A (0); 2 -> C (8); 1 -> B, the tightest fit (0).
  const std::vector<PackItem> items = {{0, 5}, {1, 3}, {2, 7}, {3, 2}, {4, 4}, {5, 1}};
  const std::vector<Pack> packs = best_fit_decreasing(items, 10);
  ASSERT_EQ(packs.size(), 3u);
  EXPECT_EQ(packs[0], (Pack{2, 1}));
  EXPECT_EQ(packs[1], (Pack{0, 4, 5}));
  EXPECT_EQ(packs[2], (Pack{3}));
}

TEST(BestFitDecreasing, TiesGoToLowestPackAndLowestId) {
  // Equal sizes sort by id; two packs with equal room: the lower index wins.
  const std::vector<PackItem> items = {{3, 6}, {1, 6}, {0, 2}, {2, 3}};
  const std::vector<Pack> packs = best_fit_decreasing(items, 9);
  ASSERT_EQ(packs.size(), 2u);
  EXPECT_EQ(packs[0], (Pack{1, 2}));  // 6 + 3: the 3 fits both packs (room 3 each): lowest
  EXPECT_EQ(packs[1], (Pack{3, 0}));
}

TEST(BestFitDecreasing, SortPacksIsStable) {
  std::vector<Pack> packs = {{0}, {1}, {2}};
  const std::vector<Tokens> sizes = {4, 9, 4};
  sort_packs_by_tokens_descending(packs, sizes);
  EXPECT_EQ(packs, (std::vector<Pack>{{1}, {0}, {2}}));
}

TEST(BalancedPacks, OneRoundSpreadsTokensEvenly) {
  // Capacity 20, 2 groups: BFD needs 2 packs ({7, 5, 4, 3, 1} and {2}), so R = 1 and there
  // are 2 packs. Sorted: 7(2) 5(0) 4(4) 3(1) 2(3) 1(5). 7 -> P0 (7); 5 -> P1 (5); 4 -> P1
  // (9); 3 -> P0 (10); 2 -> P1 (11); 1 -> P0 (11). Equal totals: order kept (stable).
  const std::vector<PackItem> items = {{0, 5}, {1, 3}, {2, 7}, {3, 2}, {4, 4}, {5, 1}};
  ASSERT_EQ(best_fit_decreasing(items, 20).size(), 2u);
  const std::vector<Pack> packs = balanced_packs(items, 20, 2);
  ASSERT_EQ(packs.size(), 2u);
  EXPECT_EQ(packs[0], (Pack{2, 1, 5}));
  EXPECT_EQ(packs[1], (Pack{0, 4, 3}));
}

TEST(BalancedPacks, RoundsStartAtBfdPacksPerGroup) {
  // The BestFitDecreasing.HandChecked items: BFD needs 3 packs of 10, so with 2 groups
  // R = ceil(3 / 2) = 2: 4 packs. 7 -> P0; 5 -> P1; 4 -> P2; 3 -> P3; 2 -> P3 (the least,
  // 3 -> 5); 1 -> P2 (4 -> 5). Totals 7, 5, 5, 5: sorted (stable) P0, P1, P2, P3.
  const std::vector<PackItem> items = {{0, 5}, {1, 3}, {2, 7}, {3, 2}, {4, 4}, {5, 1}};
  const std::vector<Pack> packs = balanced_packs(items, 10, 2);
  ASSERT_EQ(packs.size(), 4u);
  EXPECT_EQ(packs[0], (Pack{2}));
  EXPECT_EQ(packs[1], (Pack{0}));
  EXPECT_EQ(packs[2], (Pack{4, 5}));
  EXPECT_EQ(packs[3], (Pack{1, 3}));
}

TEST(BalancedPacks, AddsARoundWhenTheLeastLoadedPackIsFull) {
  // Capacity 10, one group. BFD: {5, 5} {4, 3, 3}: 2 packs, so R starts at 2. Spreading:
  // 5 -> P0, 5 -> P1, 4 -> P0 (9), 3 -> P1 (8), then 3 fits neither (8 + 3 > 10): R = 3.
  // 5(0) -> P0, 5(1) -> P1, 4(2) -> P2, 3(3) -> P2 (7), 3(4) -> P0 (5, ties P1: lower
  // index) = 8. Totals 8, 5, 7: sorted P0, P2, P1.
  const std::vector<PackItem> items = {{0, 5}, {1, 5}, {2, 4}, {3, 3}, {4, 3}};
  ASSERT_EQ(best_fit_decreasing(items, 10).size(), 2u);
  const std::vector<Pack> packs = balanced_packs(items, 10, 1);
  ASSERT_EQ(packs.size(), 3u);
  EXPECT_EQ(packs[0], (Pack{0, 4}));
  EXPECT_EQ(packs[1], (Pack{2, 3}));
  EXPECT_EQ(packs[2], (Pack{1}));
  // Two groups: R = 1 (2 packs) fails the same way; R = 2 gives 4 packs: 5 -> P0, 5 -> P1,
  // 4 -> P2, 3 -> P3, 3 -> P3 (the least, 3): totals 5, 5, 4, 6.
  const std::vector<Pack> two = balanced_packs(items, 10, 2);
  EXPECT_EQ(two, (std::vector<Pack>{{3, 4}, {0}, {1}, {2}}));
}

TEST(BalancedPacks, FewerItemsThanGroupsDropsEmptyPacks) {
  // 2 items, 4 groups: one round of 4 packs, two of them empty and dropped, so dealing
  // gives no group an empty pack.
  const std::vector<PackItem> items = {{0, 3}, {1, 9}};
  EXPECT_EQ(balanced_packs(items, 10, 4), (std::vector<Pack>{{1}, {0}}));
  EXPECT_EQ(balanced_packs(std::vector<PackItem>{{0, 10}}, 10, 8), (std::vector<Pack>{{0}}));
}

TEST(BalancedPacks, TiesGoToLowestPackAndLowestId) {
  // Equal sizes sort by id: 6(1) -> P0, 6(3) -> P1, 3(2) -> P0 (tie: lowest index), 2(0) -> P1.
  const std::vector<PackItem> items = {{3, 6}, {1, 6}, {0, 2}, {2, 3}};
  EXPECT_EQ(balanced_packs(items, 9, 2), (std::vector<Pack>{{1, 2}, {3, 0}}));
}

TEST(BalancedPacks, EveryItemMustFitAnEmptyPack) {
  const std::vector<PackItem> items = {{0, 3}, {1, 11}};
  EXPECT_NE(error_of([&] { balanced_packs(items, 10, 2); })
                .find("sequence 1 (11 tokens) must fit a pack of 10 tokens"),
            std::string::npos);
  EXPECT_THROW(balanced_packs(std::vector<PackItem>{{0, 0}}, 10, 2), InternalError);
  EXPECT_THROW(balanced_packs(items, 20, 0), InternalError);
}

TEST(BalancedPacks, RandomBatchesKeepEveryInvariant) {
  std::mt19937_64 rng(7);
  int one_round = 0;
  int several_rounds = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int groups = 1 + static_cast<int>(rng() % 16);
    const Tokens capacity = 50 + static_cast<Tokens>(rng() % 500);
    const int count = 1 + static_cast<int>(rng() % 80);
    std::vector<PackItem> items;
    std::vector<Tokens> sizes;
    Tokens largest = 0;
    for (int id = 0; id < count; ++id) {
      // Mostly short items, some up to the capacity.
      const Tokens size = rng() % 4 == 0 ? 1 + static_cast<Tokens>(rng() % capacity)
                                         : 1 + static_cast<Tokens>(rng() % (capacity / 5));
      items.push_back({id, size});
      sizes.push_back(size);
      largest = std::max(largest, size);
    }
    std::shuffle(items.begin(), items.end(), rng);
    const std::vector<Pack> packs = balanced_packs(items, capacity, groups);
    SCOPED_TRACE("trial " + std::to_string(trial));
    EXPECT_EQ(packs, balanced_packs(items, capacity, groups));  // deterministic
    std::map<std::int64_t, int> seen;
    std::vector<Tokens> totals;
    for (const Pack& pack : packs) {
      ASSERT_FALSE(pack.empty());
      for (std::int64_t id : pack) ++seen[id];
      totals.push_back(pack_tokens(pack, sizes));
      EXPECT_LE(totals.back(), capacity);
    }
    ASSERT_EQ(seen.size(), static_cast<std::size_t>(count));  // every item exactly once
    for (const auto& [id, times] : seen) EXPECT_EQ(times, 1) << id;
    EXPECT_TRUE(std::is_sorted(totals.rbegin(), totals.rend()));  // descending
    const std::size_t bfd = best_fit_decreasing(items, capacity).size();
    const std::size_t g = static_cast<std::size_t>(groups);
    // Never fewer micro-batches than BFD's packs dealt the same way.
    EXPECT_GE((packs.size() + g - 1) / g, (bfd + g - 1) / g);
    if (packs.size() <= g) {
      // One round (a second round only follows with more items than groups, which leaves
      // more than `groups` packs non-empty): spread within the largest item, counting the
      // groups left without a pack as 0 tokens.
      ++one_round;
      EXPECT_EQ(packs.size(), std::min<std::size_t>(g, static_cast<std::size_t>(count)));
      const Tokens least = packs.size() < g ? 0 : totals.back();
      EXPECT_LE(totals.front() - least, largest);
    } else {
      ++several_rounds;
    }
  }
  EXPECT_GT(one_round, 50);
  EXPECT_GT(several_rounds, 50);
}

/// Chunks cover [0, end) exactly once.
void expect_exact_cover(std::vector<Chunk> chunks, Tokens end) {
  std::sort(chunks.begin(), chunks.end(),
            [](const Chunk& a, const Chunk& b) { return a.begin_tokens < b.begin_tokens; });
  Tokens next = 0;
  for (const Chunk& chunk : chunks) {
    EXPECT_EQ(chunk.begin_tokens, next);
    EXPECT_GT(chunk.end_tokens, chunk.begin_tokens);
    next = chunk.end_tokens;
  }
  EXPECT_EQ(next, end);
}

TEST(Zigzag, PaddedHandChecked) {
  const std::vector<int> ranks = {4, 5};
  EXPECT_EQ(zigzag_padded_length(10, 2), 12);
  EXPECT_EQ(zigzag_padded_length(12, 2), 12);
  EXPECT_EQ(zigzag_padded_length(1, 8), 16);
  const std::vector<Chunk> chunks = zigzag_chunks_padded(10, ranks);
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[0].rank, 4);
  EXPECT_EQ(chunks[0].begin_tokens, 0);
  EXPECT_EQ(chunks[0].end_tokens, 3);
  EXPECT_EQ(chunks[1].rank, 4);
  EXPECT_EQ(chunks[1].begin_tokens, 9);
  EXPECT_EQ(chunks[1].end_tokens, 12);
  EXPECT_EQ(chunks[2].rank, 5);
  EXPECT_EQ(chunks[2].begin_tokens, 3);
  EXPECT_EQ(chunks[3].begin_tokens, 6);
}

TEST(Zigzag, UnpaddedHandChecked) {
  // 10 over 2 ranks: sizes 3 3 2 2; member 0 [0,3)+[8,10), member 1 [3,6)+[6,8).
  std::vector<Chunk> chunks = zigzag_chunks_unpadded(10, std::vector<int>{0, 1});
  ASSERT_EQ(chunks.size(), 4u);
  EXPECT_EQ(chunks[0].end_tokens, 3);
  EXPECT_EQ(chunks[1].begin_tokens, 8);
  EXPECT_EQ(chunks[2].begin_tokens, 3);
  EXPECT_EQ(chunks[3].end_tokens, 8);
  // 3 over 4 ranks: one token each on members 0..2, member 3 holds nothing.
  chunks = zigzag_chunks_unpadded(3, std::vector<int>{0, 1, 2, 3});
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[2].rank, 2);
  EXPECT_EQ(chunks[2].begin_tokens, 2);
}

TEST(Zigzag, BothVariantsCoverExactly) {
  for (int ring_size = 1; ring_size <= 16; ++ring_size) {
    const std::vector<int> ranks = consecutive_ranks(0, ring_size);
    for (Tokens length = 1; length <= 200; ++length) {
      SCOPED_TRACE(::testing::Message() << "length " << length << " ring " << ring_size);
      const Tokens padded = zigzag_padded_length(length, ring_size);
      EXPECT_EQ(padded % (2 * ring_size), 0);
      EXPECT_LT(padded - length, 2 * ring_size);
      expect_exact_cover(zigzag_chunks_padded(length, ranks), padded);
      const std::vector<Chunk> unpadded = zigzag_chunks_unpadded(length, ranks);
      expect_exact_cover(unpadded, length);
      std::vector<Tokens> member_tokens(static_cast<std::size_t>(ring_size), 0);
      Tokens smallest = length;
      Tokens largest = 0;
      for (const Chunk& chunk : unpadded) {
        member_tokens[static_cast<std::size_t>(chunk.rank)] += chunk.size();
        smallest = std::min(smallest, chunk.size());
        largest = std::max(largest, chunk.size());
      }
      if (length >= 2 * ring_size) {
        EXPECT_LE(largest - smallest, 1);  // no empty chunks
      }
      const auto [low, high] = std::minmax_element(member_tokens.begin(), member_tokens.end());
      EXPECT_LE(*high - *low, 1);
    }
  }
}

TEST(Contiguous, EvenSplitLargerFirst) {
  const std::vector<Chunk> chunks = contiguous_chunks(10, std::vector<int>{7, 8, 9});
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].size(), 4);
  EXPECT_EQ(chunks[1].size(), 3);
  EXPECT_EQ(chunks[2].rank, 9);
  EXPECT_EQ(chunks[2].end_tokens, 10);
  expect_exact_cover(contiguous_chunks(2, std::vector<int>{0, 1, 2, 3}), 2);
}

TEST(Capacity, SolvedFromTheMemoryCheck) {
  const FakeCostModel cost;
  EXPECT_EQ(usable_tokens_per_rank(cost, Scheme::local, 1), 194);       // 13200 / 68
  EXPECT_EQ(usable_tokens_per_rank(cost, Scheme::ring, 4), 100);        // / (68 + 2*32)
  EXPECT_EQ(usable_tokens_per_rank(cost, Scheme::ring, 1), 194);        // degree 1 is local
  EXPECT_EQ(usable_tokens_per_rank(cost, Scheme::ulysses, 2), 113);     // / (68 + 48)
  EXPECT_EQ(usable_tokens_per_rank(cost, Scheme::all_gather, 2), 100);  // / (68 + 2*32)
  EXPECT_EQ(usable_tokens_per_rank(cost, Scheme::all_gather, 4), 67);   // / (68 + 4*32)
  EXPECT_EQ(footprint_tokens(250, Scheme::ring, 4), 256);
  EXPECT_EQ(footprint_tokens(250, Scheme::ulysses, 4), 250);
  EXPECT_EQ(footprint_tokens(250, Scheme::ring, 1), 250);
}

TEST(DegreeSelection, SmallestPowerOfTwoThatHoldsTheLongest) {
  const FakeCostModel cost;
  auto degree_for = [&](Tokens longest, Scheme scheme) {
    return default_degree(make_batch({5, longest, 7}), cost, scheme, "test");
  };
  EXPECT_EQ(degree_for(194, Scheme::ring), 1);  // local holds 194
  EXPECT_EQ(degree_for(195, Scheme::ring), 2);  // d=2: padded 196 <= 2 * 100
  EXPECT_EQ(degree_for(250, Scheme::ring), 4);
  EXPECT_EQ(degree_for(400, Scheme::ring), 4);  // padded(400, 4) = 400 <= 4 * 100
  EXPECT_EQ(degree_for(200, Scheme::ulysses), 2);
  EXPECT_EQ(allowed_degrees(cost, Scheme::ring), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(allowed_degrees(cost, Scheme::ulysses), (std::vector<int>{1, 2}));  // 2 KV heads
  EXPECT_EQ(max_sequence_tokens(cost, Scheme::ring), 400);
  EXPECT_EQ(max_sequence_tokens(cost, Scheme::ulysses), 226);
}

TEST(DegreeSelection, RingTwoHoldsWhatFitsAfterPadding) {
  const FakeCostModel cost;
  // d=2 ring: 2 * 100 = 200 tokens, padding to a multiple of 4.
  EXPECT_TRUE(fits_group(200, cost, Scheme::ring, 2));
  EXPECT_FALSE(fits_group(201, cost, Scheme::ring, 2));
  EXPECT_EQ(default_degree(make_batch({196}), cost, Scheme::ring, "t"), 2);
}

TEST(DegreeSelection, TooLongNamesTheSequence) {
  const FakeCostModel cost;
  EXPECT_EQ(error_of([&] {
              default_degree(make_batch({5, 401}), cost, Scheme::ring, "static-cp");
            }),
            "static-cp cannot run sequence 1 (401 tokens): degree 4 groups hold 400 tokens and 4 "
            "is the largest power-of-two degree dividing the 4 ranks; lower --max-context or add "
            "--nodes");
  EXPECT_THROW(default_degree(make_batch({5, 401}), cost, Scheme::ring, "static-cp"),
               PlanningError);
}

TEST(DegreeSelection, UlyssesLimitedByKvHeads) {
  const FakeCostModel cost;
  EXPECT_EQ(
      error_of([&] {
        default_degree(make_batch({300, 5}), cost, Scheme::ulysses, "static-ulysses");
      }),
      "static-ulysses cannot run sequence 0 (300 tokens): degree 2 groups hold 226 tokens and "
      "Ulysses degree is limited to 2 by the model's 2 KV heads; use a strategy that splits "
      "further (static-cp, hybrid-dp), lower --max-context or add --nodes");
  // With 8 KV heads the same sequence runs at degree 4 on 4 ranks.
  Model mha_model = tiny_model(8);
  mha_model.heads = 8;
  mha_model.hidden = 32;
  const FakeCostModel mha(tiny_cluster(), mha_model);
  EXPECT_EQ(allowed_degrees(mha, Scheme::ulysses), (std::vector<int>{1, 2, 4}));
}

TEST(DegreeSelection, OverrideIsValidated) {
  const FakeCostModel cost;
  PlannerOptions options;
  options.degree = 3;
  EXPECT_EQ(
      error_of([&] { resolve_degree(make_batch({5}), cost, options, Scheme::ring, "static-cp"); }),
      "--degree 3 is not valid for static-cp: it must divide the 4 ranks; valid values: "
      "1, 2, 4");
  options.degree = 4;
  EXPECT_EQ(error_of([&] {
              resolve_degree(make_batch({5}), cost, options, Scheme::ulysses, "static-ulysses");
            }),
            "--degree 4 is not valid for static-ulysses: it must divide the 4 ranks and the "
            "model's 2 KV heads; valid values: 1, 2");
  options.degree = 2;
  EXPECT_EQ(resolve_degree(make_batch({5, 200}), cost, options, Scheme::ring, "t"), 2);
  EXPECT_THROW(resolve_degree(make_batch({5, 201}), cost, options, Scheme::ring, "t"),
               PlanningError);
  EXPECT_EQ(error_of([&] {
              resolve_degree(make_batch({5, 201}), cost, options, Scheme::ring, "static-cp");
            }),
            "static-cp cannot run sequence 1 (201 tokens) at --degree 2: degree-2 groups hold "
            "200 tokens; use --degree 4 (or any of: 4)");
  // Not a power of two, but dividing the ranks: accepted.
  const FakeCostModel six(tiny_cluster(1, 6));
  options.degree = 3;
  EXPECT_EQ(resolve_degree(make_batch({5}), six, options, Scheme::ring, "t"), 3);
}

}  // namespace
}  // namespace ballast::strategies
