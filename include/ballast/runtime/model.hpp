// The runtime's model: a small Llama-style decoder in fp32 (token embedding, per layer
// RMSNorm, Q/K/V projections with grouped-query heads, RoPE with positions restarting in
// every document, causal attention, output projection, RMSNorm, SwiGLU MLP; final RMSNorm
// and an LM head tied to the embedding or not; optionally a Mixtral-style mixture-of-experts
// FFN in every layer instead of the SwiGLU MLP), its hand-written backward pass and AdamW.
// Every op except attention is per token, so a rank runs them on its own tokens; attention
// goes through an AttentionEngine, which owns any communication (local, ring, all-gather,
// Ulysses, remap). With LocalAttentionEngine on all tokens this is the single-process
// reference.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "ballast/runtime/kernels.hpp"

namespace ballast::runtime {

struct ModelConfig {
  int vocab = 256;  ///< byte-level tokens
  int hidden = 64;
  int layers = 2;
  int heads = 4;
  int kv_heads = 2;  ///< divides heads (GQA)
  int ffn_hidden = 172;
  bool tied_embeddings = true;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  /// Mixture of experts (Mixtral, Jiang et al. 2024): every layer's FFN is `experts` SwiGLU
  /// experts of width expert_ffn_hidden behind a router picking experts_per_token (top-k)
  /// per token; ffn_hidden is then unused. 0 experts = the dense model.
  int experts = 0;
  int experts_per_token = 0;  ///< top-k, in [1, experts] when experts > 0
  int expert_ffn_hidden = 0;  ///< each expert's SwiGLU width
  int head_dim() const { return hidden / heads; }
  bool moe() const { return experts > 0; }
  AttentionShape attention_shape() const { return {heads, kv_heads, head_dim()}; }
  /// Throws InputError naming the field and the fix (hidden divisible by heads, even
  /// head_dim for RoPE, kv_heads divides heads, everything positive; with experts > 0,
  /// experts_per_token in [1, experts] and expert_ffn_hidden positive; without, both 0).
  void check() const;
};

/// One named tensor inside Parameters::values.
struct TensorInfo {
  std::string name;  ///< e.g. "embedding", "layer1.wq", "layer0.expert3.w_up", "final_norm", "lm_head"
  std::vector<int> shape;
  std::size_t offset = 0;
  std::size_t size = 0;
};

/// Every parameter in one flat fp32 vector (gradients use the same layout).
struct Parameters {
  std::vector<float> values;
  std::vector<TensorInfo> tensors;
  const TensorInfo& info(const std::string& name) const;  ///< throws InternalError if unknown
};

/// Deterministic initialisation (splitmix64 seeded): normal(0, 0.02)-like weights, norms 1.
Parameters init_parameters(const ModelConfig& config, std::uint64_t seed);

/// The tokens a rank runs the per-token ops on, in its own order: token ids, the target
/// of each (the next token of the same document; -1 for a document's last token), the
/// document id and the position inside the document.
struct TokenBatch {
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> targets;
  std::vector<std::int64_t> doc;
  std::vector<std::int64_t> pos;
  int size() const { return static_cast<int>(tokens.size()); }
  TokenSpan span() const { return {doc.data(), pos.data(), size()}; }
};

/// Whole documents packed in order (document i has id i): the single-process batch.
TokenBatch pack_documents(const std::vector<std::vector<std::int32_t>>& documents);

/// Attention for the tokens of a TokenBatch. q [n, heads, head_dim], k and v [n, kv_heads,
/// head_dim] in the batch's token order; out and the gradients likewise. An engine keeps
/// what its backward needs per layer between forward and backward.
class AttentionEngine {
 public:
  virtual ~AttentionEngine() = default;
  virtual void forward(int layer, const AttentionShape& shape, const TokenBatch& batch,
                       const float* q, const float* k, const float* v, float* out) = 0;
  /// Overwrites d_q, d_k, d_v.
  virtual void backward(int layer, const AttentionShape& shape, const TokenBatch& batch,
                        const float* d_out, float* d_q, float* d_k, float* d_v) = 0;
};

/// All of the batch's attention on this rank, no communication (varlen over its documents).
class LocalAttentionEngine final : public AttentionEngine {
 public:
  void forward(int layer, const AttentionShape& shape, const TokenBatch& batch, const float* q,
               const float* k, const float* v, float* out) override;
  void backward(int layer, const AttentionShape& shape, const TokenBatch& batch,
                const float* d_out, float* d_q, float* d_k, float* d_v) override;

 private:
  struct Saved {
    std::vector<float> q, k, v, out, lse;
  };
  std::vector<Saved> saved_;  ///< per layer
};

/// The N ranks of one tensor-parallel group (Megatron-LM with sequence parallelism,
/// Korthikanti et al. 2022; docs/runtime.md, "Tensor parallelism"). Every member holds the
/// group's whole TokenBatch; member m owns the contiguous sequence shard of rows
/// tensor_parallel_shard() for the per-token ops outside the linears (norms, residual
/// stream, embedding, LM head), and the m-th 1/N of the heads and of the FFN columns.
/// Collective over the group: every member calls each operation in the same order.
class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  /// Every member's shard of `width`-float rows (row_counts[m] rows from member m) into
  /// `all`, in member order.
  virtual void all_gather(const float* mine, std::span<const int> row_counts, int width,
                          float* all) = 0;
  /// The sum over members of `all` (every member's rows, member order), this member's
  /// rows of it into `mine`.
  virtual void reduce_scatter(const float* all, std::span<const int> row_counts, int width,
                              float* mine) = 0;
};

/// Member `member`'s rows [first, first + count) of `tokens` split over `members`: the
/// first tokens % members members hold one row more.
struct ShardRows {
  int first = 0;
  int count = 0;
};
ShardRows tensor_parallel_shard(int tokens, int members, int member);

/// Throws InputError unless `members` divides the heads, the KV heads and the FFN width
/// (column- and row-parallel linears split them evenly), naming the field and the fix.
void check_tensor_parallel(const ModelConfig& config, int members);

/// The N ranks of one expert-parallel group (docs/runtime.md, "Expert parallelism"): each
/// member runs the MoE layers' router and gate on its own tokens, and owns the experts
/// {e : e % N == member} (expert_owner), whose rows every member sends it. Collective over
/// the group: every member calls each operation in the same order.
class ExpertParallelGroup {
 public:
  virtual ~ExpertParallelGroup() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  /// `per_member` ints to every member (send[m * per_member ..] to member m) into `received`
  /// (received[m * per_member ..] from member m): the row counts of an all_to_all.
  virtual void exchange_counts(std::span<const int> send, int per_member,
                               std::span<int> received) = 0;
  /// Rows of `width` floats: send_rows[m] rows of `send` (member order) to member m, and
  /// received_rows[m] rows from member m into `received` (member order).
  virtual void all_to_all(const float* send, std::span<const int> send_rows, int width,
                          float* received, std::span<const int> received_rows) = 0;
};

/// The member of an expert-parallel group of `members` that owns `expert`: expert % members.
inline int expert_owner(int expert, int members) { return expert % members; }

/// Throws InputError unless `members` >= 1 divides the experts of an MoE model (every
/// member owns experts / members of them) or is 1, naming the field and the fix.
void check_expert_parallel(const ModelConfig& config, int members);

struct StepOutput {
  double loss_sum = 0;            ///< sum over this rank's targets of the cross-entropy (nats)
  std::int64_t target_count = 0;  ///< this rank's tokens with a target
  /// d(loss_sum)/d(parameters), Parameters layout. Summed over ranks and divided by the
  /// global target count, it is the gradient of the mean loss.
  std::vector<float> gradients;
  /// MoE: the smallest gap, over this rank's tokens and every layer, between the k-th and
  /// the (k+1)-th largest router logit (how far the top-k selection was from a tie);
  /// infinity for a dense model or with k = experts.
  double smallest_top_k_margin = std::numeric_limits<double>::infinity();
};

/// Forward and backward over this rank's tokens. With a tensor-parallel group (size N >
/// 1), `batch` is the group's tokens (the same on every member); this member runs the
/// per-token ops on its shard, its heads' attention through `attention` (shape with heads
/// / N and KV heads / N), its columns / rows of every projection, and the group's
/// all-gathers and reduce-scatters (2 + 2 per layer and pass). Its loss and targets are
/// its shard's; its gradients hold its slices of the split weights and its shard's part
/// of the others, so the sum over every member of every group is the full gradient.
/// An MoE model's experts run through `expert_parallel` (null or size 1: every expert
/// here): the rows of each (token, selected expert) go to the expert's owner and back, two
/// all-to-alls per layer and pass; an expert's gradients are nonzero only on its owner.
/// An MoE model with a tensor-parallel group of size > 1 is an InputError.
StepOutput forward_backward(const ModelConfig& config, const Parameters& parameters,
                            const TokenBatch& batch, AttentionEngine& attention,
                            TensorParallelGroup* tensor_parallel = nullptr,
                            ExpertParallelGroup* expert_parallel = nullptr);

/// How far a step's loss sum and gradients are from a reference step: |loss - reference| /
/// |reference| and, per parameter tensor, the norm-wise ||g - g_ref|| / ||g_ref|| (absolute
/// when the reference tensor is zero); the largest of them and what it belongs to ("loss"
/// or the tensor's name).
struct StepDifference {
  double max_relative_error = 0;
  std::string worst = "loss";
};
StepDifference compare_with_reference(const Parameters& parameters, double loss_sum,
                                      const std::vector<float>& gradients,
                                      const StepOutput& reference);

struct AdamWConfig {
  float learning_rate = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float epsilon = 1e-8f;
  float weight_decay = 0.1f;  ///< decoupled, on matrices only (not norms)
};
struct AdamWState {
  std::vector<float> m, v;
  std::int64_t step = 0;
};
/// One AdamW update of parameters with the (already averaged) gradients.
void adamw_step(const AdamWConfig& config, const std::vector<float>& gradients,
                Parameters& parameters, AdamWState& state);

}  // namespace ballast::runtime
