// Plan <-> JSON: the versioned file format of docs/plan-format.md, with errors naming the
// source and the JSON path of the offending field; Scheme names.
#include <algorithm>
#include <array>
#include <limits>
#include <span>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "ballast/error.hpp"
#include "ballast/json_file.hpp"
#include "ballast/plan.hpp"
#include "ballast/version.hpp"

namespace ballast {
namespace {

using nlohmann::json;

constexpr const char* kPlanFormatName = "ballast.plan";

// The members of each object of a plan (docs/plan-format.md); any other is an error.
constexpr std::array<std::string_view, 11> kPlanKeys = {
    "format", "version", "ballast_version", "strategy", "step", "cluster", "model",
    "cost_model", "sequence_lengths_tokens", "micro_batches", "notes"};
constexpr std::array<std::string_view, 3> kMicroBatchKeys = {"groups", "queues", "linear_layout"};
constexpr std::array<std::string_view, 6> kGroupKeys = {
    "scheme", "ranks", "routing_proxies", "routing_chunks", "ulysses_degree", "sequences"};
constexpr std::array<std::string_view, 3> kSequenceKeys = {"id", "padded_length_tokens", "chunks"};

constexpr std::array<std::pair<Scheme, const char*>, 5> kSchemeNames{{
    {Scheme::local, "local"},
    {Scheme::ring, "ring"},
    {Scheme::all_gather, "all_gather"},
    {Scheme::ulysses, "ulysses"},
    {Scheme::usp, "usp"},
}};

// ---------------------------------------------------------------- writing

json chunk_to_json(const Chunk& chunk) {
  return json::array({chunk.rank, chunk.begin_tokens, chunk.end_tokens});
}

json sequence_to_json(const SequenceChunks& sequence) {
  json chunks = json::array();
  for (const auto& chunk : sequence.chunks) chunks.push_back(chunk_to_json(chunk));
  return json{{"id", sequence.sequence_id},
              {"padded_length_tokens", sequence.padded_length_tokens},
              {"chunks", std::move(chunks)}};
}

json group_to_json(const AttentionGroup& group) {
  json sequences = json::array();
  for (const auto& sequence : group.sequences) sequences.push_back(sequence_to_json(sequence));
  json out{{"scheme", to_string(group.scheme)},
           {"ranks", group.ranks},
           {"routing_proxies", group.routing_proxies},
           {"sequences", std::move(sequences)}};
  // Optional, written only when it differs from the default so that plans without
  // pipelined routing keep their exact text.
  if (group.routing_chunks != 1) out["routing_chunks"] = group.routing_chunks;
  // Likewise the stage size: only usp groups have one other than 1.
  if (group.ulysses_degree != 1) out["ulysses_degree"] = group.ulysses_degree;
  return out;
}

json micro_batch_to_json(const MicroBatch& micro_batch) {
  json groups = json::array();
  for (const auto& group : micro_batch.groups) groups.push_back(group_to_json(group));
  json out{{"groups", std::move(groups)}};
  if (!micro_batch.queues.empty()) out["queues"] = micro_batch.queues;
  if (!micro_batch.linear_layout.empty()) {
    json layout = json::array();
    for (const auto& slice : micro_batch.linear_layout) {
      layout.push_back(
          json::array({slice.rank, slice.sequence_id, slice.begin_tokens, slice.end_tokens}));
    }
    out["linear_layout"] = std::move(layout);
  }
  return out;
}

// ---------------------------------------------------------------- reading

/// A JSON path built on the stack while reading and rendered only for an error message
/// (a plan holds millions of values; formatting every path up front would dominate).
struct JsonPath {
  const JsonPath* parent = nullptr;
  const char* key = nullptr;  ///< member name; nullptr for the root or an array element
  std::size_t index = 0;      ///< array index when key == nullptr and parent != nullptr

  JsonPath member(const char* name) const { return JsonPath{this, name, 0}; }
  JsonPath element(std::size_t i) const { return JsonPath{this, nullptr, i}; }

  std::string str() const {
    if (parent == nullptr) return "";
    const std::string head = parent->str();
    if (key == nullptr) return fmt::format("{}[{}]", head, index);
    return head.empty() ? std::string(key) : head + "." + key;
  }
};

/// A short rendering of a JSON value for error messages.
std::string describe(const json& value) {
  std::string text = value.dump();
  constexpr std::size_t kMaxChars = 40;  // keeps the message on one readable line
  if (text.size() > kMaxChars) text = text.substr(0, kMaxChars) + "...";
  return fmt::format("{} {}", value.type_name(), text);
}

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const JsonPath& path, const std::string& what) const {
    const std::string where = path.str();
    if (where.empty()) throw InputError(fmt::format("{}: {}", source_, what));
    throw InputError(fmt::format("{}: {}: {}", source_, where, what));
  }

  const json& member(const json& object, const JsonPath& path, const char* key) const {
    if (!object.is_object()) fail(path, "expected a JSON object, got " + describe(object));
    auto it = object.find(key);
    if (it == object.end()) {
      fail(path.member(key), "missing; add this field (see docs/plan-format.md)");
    }
    return *it;
  }

  /// Fails at `path` on the first member of `object` not in `known_keys`: a misspelt
  /// optional field must not leave its default in place silently. The path is formatted
  /// only on failure (this runs on every sequence of the plan).
  void reject_unknown_members(const json& object, const JsonPath& path,
                              std::span<const std::string_view> known_keys) const {
    if (const std::string* key = first_unknown_key(object, known_keys)) {
      fail(path, unknown_key_message(*key, known_keys));
    }
  }

  const json* optional_member(const json& object, const char* key) const {
    auto it = object.find(key);
    return it == object.end() ? nullptr : &*it;
  }

  const json& array(const json& value, const JsonPath& path) const {
    if (!value.is_array()) fail(path, "expected an array, got " + describe(value));
    return value;
  }

  std::int64_t integer(const json& value, const JsonPath& path) const {
    if (value.is_number_unsigned() &&
        value.get<std::uint64_t>() >
            static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail(path, "integer out of range: " + value.dump());
    }
    if (!value.is_number_integer()) fail(path, "expected an integer, got " + describe(value));
    return value.get<std::int64_t>();
  }

  int small_integer(const json& value, const JsonPath& path) const {
    const std::int64_t number = integer(value, path);
    if (number < std::numeric_limits<int>::min() || number > std::numeric_limits<int>::max()) {
      fail(path, fmt::format("integer {} does not fit in 32 bits", number));
    }
    return static_cast<int>(number);
  }

  std::string string(const json& value, const JsonPath& path) const {
    if (!value.is_string()) fail(path, "expected a string, got " + describe(value));
    return value.get<std::string>();
  }

  const std::string& source() const { return source_; }

  /// Counts `count` more chunks or linear slices at `path`; fails past kMaxPlanChunks
  /// before they are allocated.
  void add_chunks(std::size_t count, const JsonPath& path) const {
    chunks_ += static_cast<std::int64_t>(count);
    if (chunks_ > kMaxPlanChunks) {
      fail(path, fmt::format("the plan holds more than {} attention chunks and linear slices, "
                             "ballast's limit per plan; plan fewer sequences per step",
                             kMaxPlanChunks));
    }
  }

 private:
  std::string source_;
  mutable std::int64_t chunks_ = 0;
};

Chunk chunk_from_json(const Reader& reader, const json& value, const JsonPath& path) {
  if (!value.is_array() || value.size() != 3) {
    reader.fail(path, "expected [rank, begin, end], got " + describe(value));
  }
  return Chunk{reader.small_integer(value[0], path.element(0)),
               reader.integer(value[1], path.element(1)),
               reader.integer(value[2], path.element(2))};
}

LinearSlice slice_from_json(const Reader& reader, const json& value, const JsonPath& path) {
  if (!value.is_array() || value.size() != 4) {
    reader.fail(path, "expected [rank, sequence_id, begin, end], got " + describe(value));
  }
  return LinearSlice{
      reader.small_integer(value[0], path.element(0)), reader.integer(value[1], path.element(1)),
      reader.integer(value[2], path.element(2)), reader.integer(value[3], path.element(3))};
}

SequenceChunks sequence_from_json(const Reader& reader, const json& value, const JsonPath& path) {
  reader.reject_unknown_members(value, path, kSequenceKeys);
  SequenceChunks sequence;
  sequence.sequence_id = reader.integer(reader.member(value, path, "id"), path.member("id"));
  const JsonPath padded_path = path.member("padded_length_tokens");
  sequence.padded_length_tokens =
      reader.integer(reader.member(value, path, "padded_length_tokens"), padded_path);
  const JsonPath chunks_path = path.member("chunks");
  const json& chunks = reader.array(reader.member(value, path, "chunks"), chunks_path);
  reader.add_chunks(chunks.size(), chunks_path);
  sequence.chunks.reserve(chunks.size());
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    sequence.chunks.push_back(chunk_from_json(reader, chunks[i], chunks_path.element(i)));
  }
  return sequence;
}

std::vector<int> rank_list_from_json(const Reader& reader, const json& value,
                                     const JsonPath& path) {
  reader.array(value, path);
  std::vector<int> ranks;
  ranks.reserve(value.size());
  for (std::size_t i = 0; i < value.size(); ++i) {
    ranks.push_back(reader.small_integer(value[i], path.element(i)));
  }
  return ranks;
}

Scheme scheme_from_json(const Reader& reader, const json& value, const JsonPath& path) {
  const std::string text = reader.string(value, path);
  try {
    return parse_scheme(text);
  } catch (const InputError& error) {
    reader.fail(path, error.what());
  }
}

AttentionGroup group_from_json(const Reader& reader, const json& value, const JsonPath& path) {
  reader.reject_unknown_members(value, path, kGroupKeys);
  AttentionGroup group;
  group.scheme =
      scheme_from_json(reader, reader.member(value, path, "scheme"), path.member("scheme"));
  group.ranks =
      rank_list_from_json(reader, reader.member(value, path, "ranks"), path.member("ranks"));
  group.routing_proxies = reader.small_integer(reader.member(value, path, "routing_proxies"),
                                               path.member("routing_proxies"));
  if (const json* chunks = reader.optional_member(value, "routing_chunks")) {
    group.routing_chunks = reader.small_integer(*chunks, path.member("routing_chunks"));
  }
  if (const json* degree = reader.optional_member(value, "ulysses_degree")) {
    group.ulysses_degree = reader.small_integer(*degree, path.member("ulysses_degree"));
  }
  const JsonPath sequences_path = path.member("sequences");
  const json& sequences = reader.array(reader.member(value, path, "sequences"), sequences_path);
  group.sequences.reserve(sequences.size());
  for (std::size_t i = 0; i < sequences.size(); ++i) {
    group.sequences.push_back(sequence_from_json(reader, sequences[i], sequences_path.element(i)));
  }
  return group;
}

std::vector<std::vector<int>> queues_from_json(const Reader& reader, const json& value,
                                               const JsonPath& path) {
  reader.array(value, path);
  std::vector<std::vector<int>> queues;
  queues.reserve(value.size());
  for (std::size_t i = 0; i < value.size(); ++i) {
    queues.push_back(rank_list_from_json(reader, value[i], path.element(i)));
  }
  return queues;
}

MicroBatch micro_batch_from_json(const Reader& reader, const json& value, const JsonPath& path) {
  reader.reject_unknown_members(value, path, kMicroBatchKeys);
  MicroBatch micro_batch;
  const JsonPath groups_path = path.member("groups");
  const json& groups = reader.array(reader.member(value, path, "groups"), groups_path);
  for (std::size_t i = 0; i < groups.size(); ++i) {
    micro_batch.groups.push_back(group_from_json(reader, groups[i], groups_path.element(i)));
  }
  if (const json* queues = reader.optional_member(value, "queues")) {
    micro_batch.queues = queues_from_json(reader, *queues, path.member("queues"));
  }
  if (const json* layout = reader.optional_member(value, "linear_layout")) {
    const JsonPath layout_path = path.member("linear_layout");
    reader.array(*layout, layout_path);
    reader.add_chunks(layout->size(), layout_path);
    micro_batch.linear_layout.reserve(layout->size());
    for (std::size_t i = 0; i < layout->size(); ++i) {
      micro_batch.linear_layout.push_back(
          slice_from_json(reader, (*layout)[i], layout_path.element(i)));
    }
  }
  return micro_batch;
}

void check_format_and_version(const Reader& reader, const json& root, const JsonPath& path) {
  const JsonPath format_path = path.member("format");
  const std::string format = reader.string(reader.member(root, path, "format"), format_path);
  if (format != kPlanFormatName) {
    reader.fail(format_path, fmt::format("expected \"{}\", got \"{}\"; is this a ballast plan?",
                                         kPlanFormatName, format));
  }
  const JsonPath version_path = path.member("version");
  const auto version = reader.integer(reader.member(root, path, "version"), version_path);
  if (version != kPlanFormatVersion) {
    reader.fail(version_path,
                fmt::format("plan format version {} is not supported; this ballast reads "
                            "version {} only; re-create the plan with this ballast",
                            version, kPlanFormatVersion));
  }
}

/// " (the plan was written by ballast 0.2.0; this is ballast 0.1.0)" when the plan
/// records another writer, else "": that ballast may write keys or values this one does
/// not know, which is worth saying next to any reading error.
std::string other_writer_note(const json& root) {
  if (!root.is_object()) return "";
  const auto writer = root.find("ballast_version");
  if (writer == root.end() || !writer->is_string() || *writer == version()) return "";
  constexpr std::size_t kMaxShownBytes = 40;
  std::string shown = writer->get<std::string>();
  if (shown.size() > kMaxShownBytes) {
    std::size_t cut = kMaxShownBytes;  // not inside a UTF-8 sequence (0b10xxxxxx continues one)
    while (cut > 0 && (static_cast<unsigned char>(shown[cut]) & 0xC0) == 0x80) --cut;
    shown = shown.substr(0, cut) + "...";
  }
  std::replace_if(shown.begin(), shown.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x20; }, '?');  // one line
  return fmt::format(" (the plan was written by ballast {}; this is ballast {})", shown,
                     version());
}

Plan read_plan(const nlohmann::json& json, const std::string& source) {
  const Reader reader(source);
  const JsonPath root;
  if (!json.is_object())
    reader.fail(root, "expected a JSON object (a ballast plan), got " + describe(json));
  check_format_and_version(reader, json, root);
  // Optional: plans written before ballast recorded its version lack it.
  if (const nlohmann::json* writer = reader.optional_member(json, "ballast_version")) {
    reader.string(*writer, root.member("ballast_version"));
  }
  reader.reject_unknown_members(json, root, kPlanKeys);
  Plan plan;
  plan.version = kPlanFormatVersion;
  plan.strategy = reader.string(reader.member(json, root, "strategy"), root.member("strategy"));
  plan.step = reader.integer(reader.member(json, root, "step"), root.member("step"));
  plan.cluster = cluster_from_json(reader.member(json, root, "cluster"), source + ": cluster");
  plan.model = model_from_json(reader.member(json, root, "model"), source + ": model");
  const nlohmann::json& cost_model = reader.member(json, root, "cost_model");
  if (!cost_model.is_object()) {
    reader.fail(root.member("cost_model"), "expected a JSON object, got " + describe(cost_model));
  }
  reject_unknown_cost_model_keys(cost_model, source + ": cost_model");
  plan.cost_model = cost_model;
  const JsonPath lengths_path = root.member("sequence_lengths_tokens");
  const auto& lengths =
      reader.array(reader.member(json, root, "sequence_lengths_tokens"), lengths_path);
  if (static_cast<std::int64_t>(lengths.size()) > kMaxBatchSequences) {
    reader.fail(lengths_path, fmt::format("{} sequences, over ballast's limit of {} per plan; "
                                          "plan fewer sequences per step",
                                          lengths.size(), kMaxBatchSequences));
  }
  plan.sequence_lengths_tokens.reserve(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    plan.sequence_lengths_tokens.push_back(reader.integer(lengths[i], lengths_path.element(i)));
  }
  const JsonPath batches_path = root.member("micro_batches");
  const auto& batches = reader.array(reader.member(json, root, "micro_batches"), batches_path);
  const auto micro_batches = static_cast<std::int64_t>(batches.size());
  if (micro_batches > kMaxMicroBatches ||
      micro_batches * plan.cluster.ranks() > kMaxRankMicroBatches) {
    reader.fail(batches_path,
                fmt::format("{} micro-batches on {} GPUs, over ballast's limits of {} "
                            "micro-batches and {} micro-batches x GPUs per plan; split the "
                            "batch into several steps",
                            micro_batches, plan.cluster.ranks(), kMaxMicroBatches,
                            kMaxRankMicroBatches));
  }
  for (std::size_t i = 0; i < batches.size(); ++i) {
    plan.micro_batches.push_back(
        micro_batch_from_json(reader, batches[i], batches_path.element(i)));
  }
  if (const nlohmann::json* notes = reader.optional_member(json, "notes")) {
    const JsonPath notes_path = root.member("notes");
    const auto& items = reader.array(*notes, notes_path);
    if (static_cast<std::int64_t>(items.size()) > kMaxMicroBatches) {
      reader.fail(notes_path, fmt::format("{} notes, over ballast's limit of {} per plan; keep "
                                          "one per micro-batch at most",
                                          items.size(), kMaxMicroBatches));
    }
    for (std::size_t i = 0; i < items.size(); ++i) {
      plan.notes.push_back(reader.string(items[i], notes_path.element(i)));
    }
  }
  return plan;
}

}  // namespace

std::string to_string(Scheme scheme) {
  for (const auto& [value, name] : kSchemeNames) {
    if (value == scheme) return name;
  }
  BALLAST_CHECK(false, fmt::format("unknown Scheme value {}", static_cast<int>(scheme)));
  return "";
}

Scheme parse_scheme(const std::string& text) {
  for (const auto& [value, name] : kSchemeNames) {
    if (text == name) return value;
  }
  throw InputError(fmt::format(
      "unknown attention scheme '{}'; use one of local, ring, all_gather, ulysses, usp", text));
}

nlohmann::json to_json(const Plan& plan) {
  json micro_batches = json::array();
  for (const auto& micro_batch : plan.micro_batches) {
    micro_batches.push_back(micro_batch_to_json(micro_batch));
  }
  // ballast_version records the writer, for the reader of the file; it is not part of
  // the Plan (a plan read and written again records the ballast that wrote it last).
  json out{{"format", kPlanFormatName},
           {"version", plan.version},
           {"ballast_version", version()},
           {"strategy", plan.strategy},
           {"step", plan.step},
           {"cluster", to_json(plan.cluster)},
           {"model", to_json(plan.model)},
           {"cost_model", plan.cost_model},
           {"sequence_lengths_tokens", plan.sequence_lengths_tokens},
           {"micro_batches", std::move(micro_batches)}};
  if (!plan.notes.empty()) out["notes"] = plan.notes;  // plans without notes stay as before
  return out;
}

Plan plan_from_json(const nlohmann::json& json, const std::string& source) {
  try {
    return read_plan(json, source);
  } catch (const InputError& error) {
    const std::string note = other_writer_note(json);
    if (note.empty()) throw;
    throw InputError(error.what() + note);
  }
}

namespace {

bool is_scalar_or_flat_array(const nlohmann::json& value) {
  if (!value.is_structured()) return true;
  if (!value.is_array()) return false;
  return std::all_of(value.begin(), value.end(), [](const auto& item) { return !item.is_structured(); });
}

/// Objects and arrays of objects one member per line (indent 1); arrays holding only
/// numbers, or only arrays of numbers (chunks, lengths, queues), on one line; strings
/// (notes) one per line.
void write_plan_json(const nlohmann::json& value, int depth, std::string& out) {
  const bool inline_array =
      value.is_array() && std::all_of(value.begin(), value.end(), is_scalar_or_flat_array) &&
      std::none_of(value.begin(), value.end(), [](const auto& item) { return item.is_string(); });
  if (!value.is_structured() || inline_array || value.empty()) {
    out += value.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
    return;
  }
  const std::string inner(static_cast<std::size_t>(depth + 1), ' ');
  out += value.is_object() ? "{\n" : "[\n";
  bool first = true;
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (!first) out += ",\n";
    first = false;
    out += inner;
    if (value.is_object()) out += nlohmann::json(it.key()).dump() + ": ";
    write_plan_json(*it, depth + 1, out);
  }
  out += "\n" + std::string(static_cast<std::size_t>(depth), ' ') + (value.is_object() ? "}" : "]");
}

}  // namespace

std::string plan_to_string(const Plan& plan) {
  std::string out;
  write_plan_json(to_json(plan), 0, out);
  return out + "\n";
}

namespace {

/// Counts JSON values without building the document; stops past kMaxPlanJsonValues.
class ValueCounter final : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool null() override { return count(); }
  bool boolean(bool) override { return count(); }
  bool number_integer(number_integer_t) override { return count(); }
  bool number_unsigned(number_unsigned_t) override { return count(); }
  bool number_float(number_float_t, const string_t&) override { return count(); }
  bool string(string_t&) override { return count(); }
  bool binary(binary_t&) override { return count(); }
  bool start_object(std::size_t) override { return count(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return count(); }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;  // the document parse below reports it
  }
  bool over_limit() const { return values_ > kMaxPlanJsonValues; }

 private:
  bool count() { return ++values_ <= kMaxPlanJsonValues; }
  std::int64_t values_ = 0;
};

/// The plan file parsed, after checking that its document stays within
/// kMaxPlanJsonValues values (a parsed value takes ~30 bytes, 10x its text).
nlohmann::json read_plan_json(const std::string& path) {
  const std::string text = read_text_file(path);
  // Every value takes at least one byte, so only larger files can be over the limit.
  if (static_cast<std::int64_t>(text.size()) > kMaxPlanJsonValues) {
    ValueCounter counter;
    nlohmann::json::sax_parse(text, &counter);
    if (counter.over_limit()) {
      throw InputError(fmt::format(
          "{}: the plan file holds more than {} JSON values, ballast's limit for a plan file "
          "(a plan holds at most {} chunks); plan fewer sequences per step",
          path, kMaxPlanJsonValues, kMaxPlanChunks));
    }
  }
  return parse_json_text(text, path);
}

}  // namespace

std::vector<Plan> read_plan_file(const std::string& path) {
  const nlohmann::json json = read_plan_json(path);
  std::vector<Plan> plans;
  if (json.is_array()) {
    for (std::size_t i = 0; i < json.size(); ++i) {
      plans.push_back(plan_from_json(json[i], fmt::format("{}[{}]", path, i)));
    }
  } else {
    plans.push_back(plan_from_json(json, path));
  }
  if (plans.empty()) throw InputError(fmt::format("{}: holds no plan (an empty array)", path));
  return plans;
}

}  // namespace ballast
