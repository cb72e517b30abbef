// The runtime's model: a small Llama-style decoder in fp32 (token embedding, per layer
// RMSNorm, Q/K/V projections with grouped-query heads, RoPE with positions restarting in
// every document, causal attention, output projection, RMSNorm, SwiGLU MLP; final RMSNorm
// and an LM head tied to the embedding or not), its hand-written backward pass and AdamW.
// Every op except attention is per token, so a rank runs them on its own tokens; attention
// goes through an AttentionEngine, which owns any communication (local, ring, all-gather,
// Ulysses, remap). With LocalAttentionEngine on all tokens this is the single-process
// reference.
#pragma once

#include <cstdint>
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
  int head_dim() const { return hidden / heads; }
  AttentionShape attention_shape() const { return {heads, kv_heads, head_dim()}; }
  /// Throws InputError naming the field and the fix (hidden divisible by heads, even
  /// head_dim for RoPE, kv_heads divides heads, everything positive).
  void check() const;
};

/// One named tensor inside Parameters::values.
struct TensorInfo {
  std::string name;  ///< e.g. "embedding", "layer1.wq", "final_norm", "lm_head"
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

struct StepOutput {
  double loss_sum = 0;            ///< sum over this rank's targets of the cross-entropy (nats)
  std::int64_t target_count = 0;  ///< this rank's tokens with a target
  /// d(loss_sum)/d(parameters), Parameters layout. Summed over ranks and divided by the
  /// global target count, it is the gradient of the mean loss.
  std::vector<float> gradients;
};

/// Forward and backward over this rank's tokens. With a tensor-parallel group (size N >
/// 1), `batch` is the group's tokens (the same on every member); this member runs the
/// per-token ops on its shard, its heads' attention through `attention` (shape with heads
/// / N and KV heads / N), its columns / rows of every projection, and the group's
/// all-gathers and reduce-scatters (2 + 2 per layer and pass). Its loss and targets are
/// its shard's; its gradients hold its slices of the split weights and its shard's part
/// of the others, so the sum over every member of every group is the full gradient.
StepOutput forward_backward(const ModelConfig& config, const Parameters& parameters,
                            const TokenBatch& batch, AttentionEngine& attention,
                            TensorParallelGroup* tensor_parallel = nullptr);

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
