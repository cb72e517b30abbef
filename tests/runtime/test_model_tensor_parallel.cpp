// Tensor parallelism in the runtime's model without MPI: N threads, each a member of one TP
// group (a shared-memory TensorParallelGroup), run forward_backward on the same batch with
// their heads' local attention; the sum of their losses and gradients equals the single
// process, and each member's gradient of a split weight is zero outside its slice.
#include <gtest/gtest.h>

#include <barrier>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "ballast/error.hpp"
#include "ballast/runtime/model.hpp"
#include "ballast/workload.hpp"

namespace ballast::runtime {
namespace {

/// The members' buffers meet through shared pointers between two barriers.
class ThreadGroup final : public TensorParallelGroup {
 public:
  struct Shared {
    explicit Shared(int members) : barrier(members), inputs(static_cast<std::size_t>(members)) {}
    std::barrier<> barrier;
    std::vector<const float*> inputs;
  };
  ThreadGroup(Shared& shared, int size, int rank) : shared_(shared), size_(size), rank_(rank) {}
  int size() const override { return size_; }
  int rank() const override { return rank_; }
  void all_gather(const float* mine, std::span<const int> row_counts, int width, float* all) override {
    shared_.inputs[static_cast<std::size_t>(rank_)] = mine;
    shared_.barrier.arrive_and_wait();
    std::size_t at = 0;
    for (int m = 0; m < size_; ++m) {
      const std::size_t floats = static_cast<std::size_t>(row_counts[static_cast<std::size_t>(m)]) * width;
      std::copy_n(shared_.inputs[static_cast<std::size_t>(m)], floats, all + at);
      at += floats;
    }
    shared_.barrier.arrive_and_wait();
  }
  void reduce_scatter(const float* all, std::span<const int> row_counts, int width, float* mine) override {
    shared_.inputs[static_cast<std::size_t>(rank_)] = all;
    shared_.barrier.arrive_and_wait();
    std::size_t first = 0;
    for (int m = 0; m < rank_; ++m) first += static_cast<std::size_t>(row_counts[static_cast<std::size_t>(m)]) * width;
    const std::size_t floats = static_cast<std::size_t>(row_counts[static_cast<std::size_t>(rank_)]) * width;
    for (std::size_t i = 0; i < floats; ++i) {
      float sum = 0;
      for (int m = 0; m < size_; ++m) sum += shared_.inputs[static_cast<std::size_t>(m)][first + i];
      mine[i] = sum;
    }
    shared_.barrier.arrive_and_wait();
  }

 private:
  Shared& shared_;
  int size_, rank_;
};

ModelConfig config_of(bool tied) {
  ModelConfig config;
  config.vocab = 40;
  config.hidden = 32;
  config.layers = 2;
  config.heads = 8;
  config.kv_heads = 4;
  config.ffn_hidden = 24;
  config.tied_embeddings = tied;
  return config;
}

TokenBatch random_batch(std::uint64_t seed, int vocab) {
  std::uint64_t state = seed;
  std::vector<std::vector<std::int32_t>> documents;
  for (int d = 0; d < 6; ++d) {
    std::vector<std::int32_t> document(1 + uniform_below(state, 19));
    for (auto& token : document) token = static_cast<std::int32_t>(uniform_below(state, vocab));
    documents.push_back(document);
  }
  return pack_documents(documents);
}

/// Every member's output, run on its own thread.
std::vector<StepOutput> run_members(const ModelConfig& config, const Parameters& parameters,
                                    const TokenBatch& batch, int members) {
  ThreadGroup::Shared shared(members);
  std::vector<StepOutput> outputs(static_cast<std::size_t>(members));
  std::vector<std::thread> threads;
  for (int m = 0; m < members; ++m) {
    threads.emplace_back([&, m] {
      ThreadGroup group(shared, members, m);
      LocalAttentionEngine attention;  // this member's heads of every token
      outputs[static_cast<std::size_t>(m)] = forward_backward(config, parameters, batch, attention, &group);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return outputs;
}

TEST(ModelTensorParallel, ShardsSplitTheTokensInMemberOrder) {
  EXPECT_EQ(tensor_parallel_shard(7, 3, 0).first, 0);
  EXPECT_EQ(tensor_parallel_shard(7, 3, 0).count, 3);
  EXPECT_EQ(tensor_parallel_shard(7, 3, 1).first, 3);
  EXPECT_EQ(tensor_parallel_shard(7, 3, 1).count, 2);
  EXPECT_EQ(tensor_parallel_shard(7, 3, 2).first, 5);
  EXPECT_EQ(tensor_parallel_shard(7, 3, 2).count, 2);
  EXPECT_EQ(tensor_parallel_shard(1, 4, 3).count, 0);  // fewer tokens than members
  EXPECT_EQ(tensor_parallel_shard(1, 4, 3).first, 1);
}

TEST(ModelTensorParallel, UnevenSplitsAreRefusedNamingTheField) {
  ModelConfig config = config_of(true);
  EXPECT_NO_THROW(check_tensor_parallel(config, 4));
  try {
    check_tensor_parallel(config, 8);  // 4 KV heads
    FAIL() << "8-way TP of 4 KV heads accepted";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("kv_heads = 4 is not divisible by the tensor-parallel size 8"),
              std::string::npos) << error.what();
  }
  config.ffn_hidden = 26;
  EXPECT_THROW(check_tensor_parallel(config, 4), InputError);
}

class ModelTensorParallelSum : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(ModelTensorParallelSum, MembersAddUpToTheSingleProcess) {
  const auto [members, tied] = GetParam();
  const ModelConfig config = config_of(tied);
  const Parameters parameters = init_parameters(config, 5);
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    const TokenBatch batch = random_batch(seed, config.vocab);
    LocalAttentionEngine reference_engine;
    const StepOutput reference = forward_backward(config, parameters, batch, reference_engine);
    const std::vector<StepOutput> outputs = run_members(config, parameters, batch, members);
    double loss_sum = 0;
    std::int64_t targets = 0;
    std::vector<float> gradients(parameters.values.size(), 0.0f);
    for (const StepOutput& output : outputs) {
      loss_sum += output.loss_sum;
      targets += output.target_count;
      for (std::size_t i = 0; i < gradients.size(); ++i) gradients[i] += output.gradients[i];
    }
    EXPECT_EQ(targets, reference.target_count);
    const StepDifference difference = compare_with_reference(parameters, loss_sum, gradients, reference);
    EXPECT_LT(difference.max_relative_error, 1e-5) << difference.worst << ", seed " << seed;
    // Member m's wq gradient lives in its heads' columns only; its w_down in its FFN rows.
    const int head_columns = config.hidden / members;  // q_width / members
    for (int m = 0; m < members; ++m) {
      const std::vector<float>& g = outputs[static_cast<std::size_t>(m)].gradients;
      const TensorInfo& wq = parameters.info("layer0.wq");
      const TensorInfo& w_down = parameters.info("layer1.w_down");
      double inside = 0, outside = 0;
      for (int row = 0; row < config.hidden; ++row) {
        for (int column = 0; column < config.hidden; ++column) {
          const double value = std::abs(g[wq.offset + static_cast<std::size_t>(row) * config.hidden + column]);
          (column / head_columns == m ? inside : outside) += value;
        }
      }
      for (int row = 0; row < config.ffn_hidden; ++row) {
        for (int column = 0; column < config.hidden; ++column) {
          const double value = std::abs(g[w_down.offset + static_cast<std::size_t>(row) * config.hidden + column]);
          (row / (config.ffn_hidden / members) == m ? inside : outside) += value;
        }
      }
      EXPECT_GT(inside, 0) << "member " << m;
      EXPECT_EQ(outside, 0) << "member " << m;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Members, ModelTensorParallelSum,
                         ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Bool()));

}  // namespace
}  // namespace ballast::runtime
