// Model presets: FlexSP's GPT-7B/13B/30B (SYSTEMS.md section 2), the LLaMA models and the
// 8x550M mixture of experts Zeppelin evaluates (SYSTEMS.md section 3), and Mixtral-8x7B,
// with the shapes of their public configs.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ballast/error.hpp"
#include "ballast/model.hpp"
#include "ballast/text.hpp"

namespace ballast {

namespace {

/// GPT-2 BPE vocabulary, used by FlexSP's GPT models.
constexpr int kGptVocab = 50257;

/// FlexSP's GPT: GELU MLP of 4*hidden, MHA; activation MB/token and parameters (in
/// 2^30 numel, at the 192K context) from the SYSTEMS.md section 2 table.
Model flexsp_gpt(const std::string& name, int layers, int hidden, int heads,
                 double activation_mib_per_token, double parameters_gi) {
  Model model;
  model.name = name;
  model.layers = layers;
  model.hidden = hidden;
  model.heads = heads;
  model.kv_heads = heads;
  model.ffn_hidden = 4 * hidden;
  model.vocab = kGptVocab;
  model.gated_mlp = false;
  model.bytes_per_element = 2;
  model.activation_bytes_per_token = activation_mib_per_token * kMiB;
  model.parameters = parameters_gi * kGiB;
  model.provenance = fmt::format(
      "FlexSP (ASPLOS'25) {}, SYSTEMS.md section 2 table: {} layers, hidden {}, {} heads; "
      "activations {} MB/token (MB = 2^20 bytes); parameters {} x 2^30 (the table's value "
      "at the 192K context: learned position embeddings grow with the context); GELU MLP "
      "4*hidden and GPT-2 vocab 50257 assumed",
      name, layers, hidden, heads, activation_mib_per_token, parameters_gi);
  return model;
}

/// A LLaMA-family model (SwiGLU, RMSNorm, untied embeddings). Activations: 34*h bytes
/// per token per layer, Korthikanti et al. 2022 ("Reducing Activation Recomputation in
/// Large Transformer Models", selective recomputation, no tensor parallelism).
Model llama(const std::string& name, const std::string& source, int layers, int hidden,
            int heads, int kv_heads, int ffn_hidden, int vocab) {
  constexpr double kActivationBytesPerHiddenPerLayer = 34.0;  // Korthikanti et al. 2022
  Model model;
  model.name = name;
  model.layers = layers;
  model.hidden = hidden;
  model.heads = heads;
  model.kv_heads = kv_heads;
  model.ffn_hidden = ffn_hidden;
  model.vocab = vocab;
  model.gated_mlp = true;
  model.bytes_per_element = 2;
  model.activation_bytes_per_token =
      kActivationBytesPerHiddenPerLayer * static_cast<double>(hidden) * layers;
  model.parameters = estimate_parameters(model, /*tied_embeddings=*/false);
  model.provenance = fmt::format(
      "{} public config: {} layers, hidden {}, {} heads, {} KV heads, FFN {}, vocab {}; "
      "parameters estimated from the shape (untied embeddings); activations 34*hidden*layers "
      "bytes/token (Korthikanti et al. 2022, selective recomputation, no TP)",
      source, layers, hidden, heads, kv_heads, ffn_hidden, vocab);
  return model;
}

/// Routing skew of the MoE presets: coefficient of variation of the tokens per expert in
/// one layer of one micro-batch. An estimate: with 8 experts it puts the most loaded one
/// about 1.3x the mean (Model::expert_load_factor), the headroom of the expert capacity
/// factor 1.25 Switch Transformer trains with (Fedus et al., JMLR 2022, section 2.2 and
/// Table 1) for routers trained with a load-balancing loss.
constexpr double kPresetRoutingSkewCv = 0.2;

/// A LLaMA-style MoE model (Mixtral's layout): every layer's MLP is `experts` SwiGLU
/// experts of ffn_hidden, top-k routed, expert-parallel over `experts` ranks (one expert
/// per rank). Activations per token per layer: Korthikanti et al. 2022's 34*h with its
/// MLP intermediates (16*h of the 34*h at a 4*h MLP: two tensors of the MLP's width, 2
/// bytes each) replaced by the active experts' (4 bytes x experts_per_token x ffn_hidden):
/// 18*h + 4*k*ffn_hidden bytes (an estimate; the dispatched copies are not counted).
Model moe_llama(const std::string& name, const std::string& source, int layers, int hidden,
                int heads, int kv_heads, int ffn_hidden, int vocab, int experts, int top_k) {
  Model model = llama(name, source, layers, hidden, heads, kv_heads, ffn_hidden, vocab);
  model.experts = experts;
  model.experts_per_token = top_k;
  model.shared_experts = 0;
  model.expert_parallel = experts;
  model.routing_skew_cv = kPresetRoutingSkewCv;
  model.routing_seed = 0;
  model.activation_bytes_per_token =
      (18.0 * hidden + 4.0 * top_k * static_cast<double>(ffn_hidden)) * layers;
  model.parameters = estimate_parameters(model, /*tied_embeddings=*/false);
  model.provenance = fmt::format(
      "{}: {} layers, hidden {}, {} heads, {} KV heads, {} SwiGLU experts of FFN {} per "
      "layer, top-{} routing, vocab {}; parameters estimated from the shape (untied "
      "embeddings, router hidden x experts): {:.2f} B total, {:.2f} B active; expert "
      "parallelism {} (one expert per rank); activations (18*hidden + 4*top_k*FFN)*layers "
      "bytes/token (Korthikanti et al. 2022's 34*hidden with the MLP part scaled to the "
      "active experts: an estimate); routing skew cv {} (an estimate, Switch Transformer's "
      "capacity factor 1.25)",
      source, layers, hidden, heads, kv_heads, experts, ffn_hidden, top_k, vocab,
      model.parameters / 1e9, model.active_parameters(false) / 1e9, experts,
      kPresetRoutingSkewCv);
  return model;
}

}  // namespace

std::vector<std::string> model_preset_names() {
  return {"gpt-7b",   "gpt-13b",   "gpt-30b",   "llama-3b",  "openllama-3b",
          "llama-7b", "llama3-8b", "llama-13b", "llama-30b", "moe-8x550m", "mixtral-8x7b"};
}

Model model_preset(const std::string& name) {
  if (name == "gpt-7b") return flexsp_gpt(name, 32, 4096, 64, 4.480, 7.117);
  if (name == "gpt-13b") return flexsp_gpt(name, 40, 5120, 64, 4.220, 13.116);
  if (name == "gpt-30b") return flexsp_gpt(name, 60, 6656, 64, 3.417, 31.525);
  if (name == "llama-3b") return llama(name, "Llama-3.2-3B", 28, 3072, 24, 8, 8192, 128256);
  // Zeppelin's 3B: full multi-head attention; its per-hop timing matches hidden 3200 and
  // 32 heads (issue 19), the shape of OpenLLaMA-3B (openlm-research/open_llama_3b).
  if (name == "openllama-3b") {
    return llama(name, "OpenLLaMA-3B", 26, 3200, 32, 32, 8640, 32000);
  }
  if (name == "llama-7b") return llama(name, "Llama-2-7B", 32, 4096, 32, 32, 11008, 32000);
  if (name == "llama3-8b") return llama(name, "Llama-3-8B", 32, 4096, 32, 8, 14336, 128256);
  if (name == "llama-13b") return llama(name, "Llama-2-13B", 40, 5120, 40, 40, 13824, 32000);
  if (name == "llama-30b") return llama(name, "LLaMA-1 33B", 60, 6656, 52, 52, 17920, 32000);
  // Zeppelin's 8x550M MoE: the paper names it only. Inferred, read as Mixtral's "8x7B"
  // naming (8 experts in the MLP of a ~550M dense LLaMA-style model): 16 layers, hidden
  // 1536, 16 heads (MHA, head dim 96), SwiGLU FFN 4096, LLaMA-2 vocab 32000 (a 551M dense
  // model), top-2 as Mixtral and GShard.
  if (name == "moe-8x550m") {
    return moe_llama(name, "Zeppelin (EuroSys'26) 8x550M MoE, shape inferred (the paper gives "
                     "only the name; read as 8 experts in a 551M LLaMA-style model, top-2)",
                     16, 1536, 16, 16, 4096, 32000, 8, 2);
  }
  // huggingface.co/mistralai/Mixtral-8x7B-v0.1 config.json: num_hidden_layers 32,
  // hidden_size 4096, num_attention_heads 32, num_key_value_heads 8, intermediate_size
  // 14336, num_local_experts 8, num_experts_per_tok 2, vocab_size 32000, untied.
  if (name == "mixtral-8x7b") {
    return moe_llama(name, "Mixtral-8x7B public config (huggingface.co/mistralai/"
                     "Mixtral-8x7B-v0.1 config.json; Mistral AI, \"Mixtral of experts\", Dec 2023: 46.7B total, 12.9B "
                     "active parameters)",
                     32, 4096, 32, 8, 14336, 32000, 8, 2);
  }
  throw InputError(fmt::format("unknown model preset '{}'{}; known presets: {}", name,
                               did_you_mean(name, model_preset_names()),
                               fmt::join(model_preset_names(), ", ")));
}

}  // namespace ballast
