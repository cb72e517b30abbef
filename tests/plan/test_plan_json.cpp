// Plan JSON: schema, byte-identical round trip, Scheme names, and errors that name the
// source and the JSON path of the offending field.
#include <gtest/gtest.h>

#include <functional>

#include "ballast/error.hpp"
#include "ballast/plan.hpp"
#include "ballast/version.hpp"
#include "plan/plan_fixtures.hpp"

namespace ballast {
namespace {

using nlohmann::json;
using testing::base_plan;

/// The base plan with explicit queues and a linear layout, so every field is written.
Plan full_plan() {
  Plan plan = base_plan();
  plan.micro_batches[0].queues = effective_queues(plan.micro_batches[0], 8);
  plan.micro_batches[0].linear_layout = {{0, 0, 0, 1000},   {0, 1, 0, 1000},    {1, 1, 1000, 2000},
                                         {1, 6, 0, 800},    {2, 2, 0, 1500},    {3, 2, 1500, 3000},
                                         {4, 3, 0, 1000},   {5, 3, 1000, 2000}, {6, 3, 2000, 3000},
                                         {7, 3, 3000, 4000}};
  plan.micro_batches[1].groups[0].routing_proxies = 2;
  return plan;
}

TEST(PlanJson, Schema) {
  const json out = to_json(full_plan());
  EXPECT_EQ(out["format"], "ballast.plan");
  EXPECT_EQ(out["version"], 1);
  EXPECT_EQ(out["ballast_version"], version());
  EXPECT_EQ(out["strategy"], "hand-made");
  EXPECT_EQ(out["step"], 3);
  EXPECT_EQ(out["cluster"], to_json(testing::small_cluster()));
  EXPECT_EQ(out["model"], to_json(testing::small_model()));
  EXPECT_EQ(out["cost_model"], (json{{"family", "fake"}}));
  EXPECT_EQ(out["sequence_lengths_tokens"], json(testing::base_lengths()));
  const json& ring = out["micro_batches"][0]["groups"][2];
  EXPECT_EQ(ring["scheme"], "ring");
  EXPECT_EQ(ring["ranks"], json::parse("[2, 3]"));
  EXPECT_EQ(ring["routing_proxies"], 1);
  EXPECT_EQ(ring["sequences"][0]["id"], 2);
  EXPECT_EQ(ring["sequences"][0]["padded_length_tokens"], 3000);
  EXPECT_EQ(ring["sequences"][0]["chunks"],
            json::parse("[[2, 0, 750], [2, 2250, 3000], [3, 750, 1500], [3, 1500, 2250]]"));
  EXPECT_EQ(out["micro_batches"][0]["queues"][1], json::parse("[1]"));
  EXPECT_EQ(out["micro_batches"][0]["linear_layout"][2], json::parse("[1, 1, 1000, 2000]"));
  EXPECT_EQ(out["micro_batches"][1]["groups"][0]["scheme"], "all_gather");
  EXPECT_EQ(out["micro_batches"][1]["groups"][0]["routing_proxies"], 2);
  // Empty queues and layouts are omitted.
  EXPECT_FALSE(out["micro_batches"][1].contains("queues"));
  EXPECT_FALSE(out["micro_batches"][1].contains("linear_layout"));
}

TEST(PlanJson, RoundTripIsByteIdentical) {
  const std::string text = plan_to_string(full_plan());
  const Plan back = plan_from_json(json::parse(text), "plan.json");
  EXPECT_EQ(plan_to_string(back), text);
  EXPECT_EQ(back.micro_batches[0].queues, full_plan().micro_batches[0].queues);
  EXPECT_EQ(back.micro_batches[0].linear_layout.size(), 10u);
  EXPECT_EQ(back.micro_batches[0].groups[3].scheme, Scheme::ulysses);
  const std::string plain = plan_to_string(base_plan());
  EXPECT_EQ(plan_to_string(plan_from_json(json::parse(plain), "plan.json")), plain);
}

TEST(PlanJson, CanonicalTextIsDeterministic) {
  const std::string text = plan_to_string(full_plan());
  EXPECT_EQ(text, plan_to_string(full_plan()));
  EXPECT_EQ(json::parse(text), to_json(full_plan()));
  // Objects one member per line; arrays of numbers (chunks, lengths) on one line.
  EXPECT_NE(text.find("\n       \"chunks\": [[0,0,1000]],\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\"sequence_lengths_tokens\": [1000,2000,3000,4000,5000,6000,800,64]"),
            std::string::npos);
  EXPECT_EQ(text.back(), '\n');
  EXPECT_NE(text, plan_to_string(base_plan()));
}

TEST(PlanJson, SchemeNames) {
  for (Scheme scheme :
       {Scheme::local, Scheme::ring, Scheme::all_gather, Scheme::ulysses, Scheme::usp}) {
    EXPECT_EQ(parse_scheme(to_string(scheme)), scheme);
  }
  EXPECT_EQ(to_string(Scheme::usp), "usp");
  EXPECT_EQ(to_string(Scheme::all_gather), "all_gather");
  try {
    parse_scheme("zigzag");
    FAIL() << "expected InputError";
  } catch (const InputError& error) {
    EXPECT_STREQ(error.what(),
                 "unknown attention scheme 'zigzag'; use one of local, ring, all_gather, ulysses, usp");
  }
}

/// plan_from_json on the full plan's JSON after `edit`; returns the InputError message.
std::string error_after(const std::function<void(json&)>& edit) {
  json document = to_json(full_plan());
  edit(document);
  try {
    plan_from_json(document, "plan.json");
  } catch (const InputError& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected InputError";
  return "";
}

json& chunks(json& document) {
  return document["micro_batches"][0]["groups"][2]["sequences"][0]["chunks"];
}

TEST(PlanJson, TopLevelErrors) {
  EXPECT_EQ(error_after([](json& d) {
              d = json::array({1, 2});
            }),
            "plan.json: expected a JSON object (a ballast plan), got array [1,2]");
  EXPECT_EQ(error_after([](json& d) { d["format"] = "ballast.trace"; }),
            "plan.json: format: expected \"ballast.plan\", got \"ballast.trace\"; is this a "
            "ballast plan?");
  EXPECT_EQ(error_after([](json& d) { d.erase("format"); }),
            "plan.json: format: missing; add this field (see docs/plan-format.md)");
  EXPECT_EQ(error_after([](json& d) { d["version"] = 2; }),
            "plan.json: version: plan format version 2 is not supported; this ballast reads "
            "version 1 only; re-create the plan with this ballast");
  EXPECT_EQ(error_after([](json& d) { d.erase("strategy"); }),
            "plan.json: strategy: missing; add this field (see docs/plan-format.md)");
  EXPECT_EQ(error_after([](json& d) { d["step"] = "3"; }),
            "plan.json: step: expected an integer, got string \"3\"");
  EXPECT_EQ(error_after([](json& d) { d["cost_model"] = "analytical"; }),
            "plan.json: cost_model: expected a JSON object, got string \"analytical\"");
  EXPECT_EQ(error_after([](json& d) { d["sequence_lengths_tokens"][3] = 1.5; }),
            "plan.json: sequence_lengths_tokens[3]: expected an integer, got number 1.5");
  EXPECT_EQ(error_after([](json& d) { d["micro_batches"] = json::object(); }),
            "plan.json: micro_batches: expected an array, got object {}");
  // The cluster and model readers name the source and their own field.
  const std::string cluster_error = error_after([](json& d) { d["cluster"].erase("nodes"); });
  EXPECT_EQ(cluster_error.rfind("plan.json: cluster", 0), 0u) << cluster_error;
  EXPECT_NE(cluster_error.find("nodes"), std::string::npos) << cluster_error;
}

TEST(PlanJson, NestedErrorsNameTheJsonPath) {
  EXPECT_EQ(error_after([](json& d) {
              chunks(d)[1] = json::array({1, 2});
            }),
            "plan.json: micro_batches[0].groups[2].sequences[0].chunks[1]: expected [rank, "
            "begin, end], got array [1,2]");
  EXPECT_EQ(error_after([](json& d) { chunks(d)[0][1] = 0.5; }),
            "plan.json: micro_batches[0].groups[2].sequences[0].chunks[0][1]: expected an "
            "integer, got number 0.5");
  EXPECT_EQ(error_after([](json& d) { d["micro_batches"][1]["groups"][0]["scheme"] = "zigzag"; }),
            "plan.json: micro_batches[1].groups[0].scheme: unknown attention scheme 'zigzag'; "
            "use one of local, ring, all_gather, ulysses, usp");
  EXPECT_EQ(
      error_after([](json& d) { d["micro_batches"][1]["groups"][1].erase("routing_proxies"); }),
      "plan.json: micro_batches[1].groups[1].routing_proxies: missing; add this field "
      "(see docs/plan-format.md)");
  EXPECT_EQ(error_after([](json& d) { d["micro_batches"][0]["groups"][0]["sequences"][0] = 5; }),
            "plan.json: micro_batches[0].groups[0].sequences[0]: expected a JSON object, got "
            "number 5");
  EXPECT_EQ(error_after([](json& d) {
              d["micro_batches"][0]["groups"][1]["sequences"][1].erase("padded_length_tokens");
            }),
            "plan.json: micro_batches[0].groups[1].sequences[1].padded_length_tokens: missing; "
            "add this field (see docs/plan-format.md)");
  EXPECT_EQ(
      error_after([](json& d) { d["micro_batches"][0]["groups"][3]["ranks"][2] = 4294967296; }),
      "plan.json: micro_batches[0].groups[3].ranks[2]: integer 4294967296 does not fit in "
      "32 bits");
  EXPECT_EQ(error_after([](json& d) { d["micro_batches"][0]["queues"] = 3; }),
            "plan.json: micro_batches[0].queues: expected an array, got number 3");
  EXPECT_EQ(error_after([](json& d) { d["micro_batches"][0]["queues"][4][0] = "g1"; }),
            "plan.json: micro_batches[0].queues[4][0]: expected an integer, got string \"g1\"");
  EXPECT_EQ(error_after([](json& d) {
              d["micro_batches"][0]["linear_layout"][9] = {7, 3, 3000};
            }),
            "plan.json: micro_batches[0].linear_layout[9]: expected [rank, sequence_id, begin, "
            "end], got array [7,3,3000]");
}

TEST(PlanJson, RoutingChunksAreOptionalAndWrittenOnlyWhenNotOne) {
  // Absent: the default 1, and no key in the canonical text (older plans keep their bytes).
  const std::string plain = plan_to_string(base_plan());
  EXPECT_EQ(plain.find("routing_chunks"), std::string::npos);
  const Plan plain_back = plan_from_json(json::parse(plain), "plan.json");
  for (const MicroBatch& micro_batch : plain_back.micro_batches) {
    for (const AttentionGroup& group : micro_batch.groups) EXPECT_EQ(group.routing_chunks, 1);
  }
  // 4: written on that group only, read back, byte-identical round trip.
  Plan plan = full_plan();
  plan.micro_batches[1].groups[0].routing_chunks = 4;
  const json out = to_json(plan);
  EXPECT_EQ(out["micro_batches"][1]["groups"][0]["routing_chunks"], 4);
  EXPECT_FALSE(out["micro_batches"][0]["groups"][2].contains("routing_chunks"));
  const std::string text = plan_to_string(plan);
  const Plan back = plan_from_json(json::parse(text), "plan.json");
  EXPECT_EQ(back.micro_batches[1].groups[0].routing_chunks, 4);
  EXPECT_EQ(back.micro_batches[0].groups[2].routing_chunks, 1);
  EXPECT_EQ(plan_to_string(back), text);
  // Read with the same integer reader as routing_proxies.
  EXPECT_EQ(
      error_after([](json& d) { d["micro_batches"][1]["groups"][0]["routing_chunks"] = 1.5; }),
      "plan.json: micro_batches[1].groups[0].routing_chunks: expected an integer, got "
      "number 1.5");
  EXPECT_EQ(error_after(
                [](json& d) { d["micro_batches"][1]["groups"][0]["routing_chunks"] = 4294967296; }),
            "plan.json: micro_batches[1].groups[0].routing_chunks: integer 4294967296 does not "
            "fit in 32 bits");
}

TEST(PlanJson, UlyssesDegreeIsWrittenOnlyForUspGroups) {
  const std::string plain = plan_to_string(base_plan());
  EXPECT_EQ(plain.find("ulysses_degree"), std::string::npos);
  Plan plan = full_plan();
  AttentionGroup& group = plan.micro_batches[1].groups[0];
  group.scheme = Scheme::usp;
  group.ulysses_degree = 2;
  const json out = to_json(plan);
  EXPECT_EQ(out["micro_batches"][1]["groups"][0]["scheme"], "usp");
  EXPECT_EQ(out["micro_batches"][1]["groups"][0]["ulysses_degree"], 2);
  EXPECT_FALSE(out["micro_batches"][0]["groups"][2].contains("ulysses_degree"));
  const std::string text = plan_to_string(plan);
  const Plan back = plan_from_json(json::parse(text), "plan.json");
  EXPECT_EQ(back.micro_batches[1].groups[0].scheme, Scheme::usp);
  EXPECT_EQ(back.micro_batches[1].groups[0].ulysses_degree, 2);
  EXPECT_EQ(back.micro_batches[0].groups[2].ulysses_degree, 1);
  EXPECT_EQ(plan_to_string(back), text);
  EXPECT_EQ(
      error_after([](json& d) { d["micro_batches"][1]["groups"][0]["ulysses_degree"] = "2"; }),
      "plan.json: micro_batches[1].groups[0].ulysses_degree: expected an integer, got "
      "string \"2\"");
}

TEST(PlanJson, NotesAreWrittenOnlyWhenPresentOnePerLine) {
  const std::string plain = plan_to_string(base_plan());
  EXPECT_EQ(plain.find("notes"), std::string::npos);
  EXPECT_TRUE(plan_from_json(json::parse(plain), "plan.json").notes.empty());
  Plan plan = full_plan();
  plan.notes = {"micro-batch 1: GPUs 2-3 hold no attention work: why", "a second note"};
  const std::string text = plan_to_string(plan);
  EXPECT_NE(text.find("\"notes\": [\n  \"micro-batch 1: GPUs 2-3"), std::string::npos) << text;
  const Plan back = plan_from_json(json::parse(text), "plan.json");
  EXPECT_EQ(back.notes, plan.notes);
  EXPECT_EQ(plan_to_string(back), text);
  EXPECT_EQ(error_after([](json& d) { d["notes"] = "one"; }),
            "plan.json: notes: expected an array, got string \"one\"");
  EXPECT_EQ(error_after([](json& d) { d["notes"] = json::array({1}); }),
            "plan.json: notes[0]: expected a string, got number 1");
}

TEST(PlanJson, BallastVersionIsWrittenAndOptionalOnReading) {
  // Every file records the writing ballast (alphabetical order: the first member).
  const std::string text = plan_to_string(base_plan());
  const std::string opening = std::string("{\n \"ballast_version\": \"") + version() + "\",\n";
  EXPECT_EQ(text.rfind(opening, 0), 0u) << text.substr(0, 80);
  // Plans of the same format version written before it (no key) or by another ballast
  // read; writing one again records this ballast.
  json older = to_json(base_plan());
  older.erase("ballast_version");
  EXPECT_EQ(plan_to_string(plan_from_json(older, "old.json")), text);
  json other = to_json(base_plan());
  other["ballast_version"] = "0.0.1";
  EXPECT_EQ(plan_to_string(plan_from_json(other, "other.json")), text);
  EXPECT_EQ(error_after([](json& d) { d["ballast_version"] = 1; }),
            "plan.json: ballast_version: expected a string, got number 1");
}

TEST(PlanJson, UnknownKeysAreErrorsAtEveryLevel) {
  // A misspelt optional key used to be ignored: routing_chunk left routing_chunks at 1.
  EXPECT_EQ(error_after([](json& d) { d["micro_batches"][1]["groups"][0]["routing_chunk"] = 4; }),
            "plan.json: micro_batches[1].groups[0]: unknown key \"routing_chunk\" (did you "
            "mean \'routing_chunks\'?)");
  EXPECT_EQ(error_after([](json& d) { d["ballast_versoin"] = "0.1.0"; }),
            "plan.json: unknown key \"ballast_versoin\" (did you mean 'ballast_version'?)");
  // A misspelt required key: the suggestion rather than "missing".
  EXPECT_EQ(error_after([](json& d) {
              d["stratgy"] = d["strategy"];
              d.erase("strategy");
            }),
            "plan.json: unknown key \"stratgy\" (did you mean 'strategy'?)");
  EXPECT_EQ(error_after([](json& d) { d["micro_batches"][0]["queue"] = json::array(); }),
            "plan.json: micro_batches[0]: unknown key \"queue\" (did you mean 'queues'?)");
  EXPECT_EQ(error_after([](json& d) {
              d["micro_batches"][0]["groups"][1]["sequences"][1]["padded_length"] = 5;
            }),
            "plan.json: micro_batches[0].groups[1].sequences[1]: unknown key \"padded_length\""
            " (did you mean \'padded_length_tokens\'?)");
  // The cluster, model and cost-model readers check theirs, named under the plan.
  EXPECT_EQ(error_after([](json& d) { d["cluster"]["nics_per_nodes"] = 4; }),
            "plan.json: cluster: unknown key \"nics_per_nodes\" (did you mean 'nics_per_node'?)");
  EXPECT_EQ(error_after([](json& d) { d["model"]["kv_head"] = 4; }),
            "plan.json: model: unknown key \"kv_head\" (did you mean 'kv_heads'?)");
  EXPECT_EQ(error_after([](json& d) { d["cost_model"] = {{"family", "analytical"}, {"x", 1}}; }),
            "plan.json: cost_model: unknown key \"x\"; the known keys are family");
  EXPECT_EQ(error_after([](json& d) {
              d["cost_model"] = load_cost_model_spec("flexsp-a100-192k");
              d["cost_model"]["models"][0]["b1_msec"] = 1.0;
            }),
            "plan.json: cost_model: models[0]: unknown key \"b1_msec\" (did you mean 'b1_ms'?)");
  // A family ballast does not know (the tests' fake one) is make_cost_model's to refuse.
  json fake = to_json(full_plan());
  fake["cost_model"]["anything"] = 1;
  EXPECT_EQ(plan_from_json(fake, "plan.json").cost_model["anything"], 1);
}

TEST(PlanJson, ErrorsNameAnotherWritingBallast) {
  // A newer ballast may write a key this one does not know: the message says who wrote it.
  EXPECT_EQ(error_after([](json& d) {
              d["ballast_version"] = "9.9.9";
              d["micro_batches"][0]["groups"][0]["placement"] = "spread";
            }),
            std::string("plan.json: micro_batches[0].groups[0]: unknown key \"placement\"; the "
                        "known keys are scheme, ranks, routing_proxies, routing_chunks, ulysses_degree, sequences "
                        "(the plan was written by ballast 9.9.9; this is ballast ") +
                version() + ")");
  EXPECT_EQ(error_after([](json& d) {
              d["ballast_version"] = "9.9.9";
              d["version"] = 2;
            }),
            std::string("plan.json: version: plan format version 2 is not supported; this ballast "
                        "reads version 1 only; re-create the plan with this ballast (the plan was "
                        "written by ballast 9.9.9; this is ballast ") +
                version() + ")");
  // A long or odd version string stays one short line.
  EXPECT_EQ(error_after([](json& d) {
              d["ballast_version"] = "9.9\n" + std::string(100, 'x');
              d["step"] = "3";
            }),
            "plan.json: step: expected an integer, got string \"3\" (the plan was written by "
            "ballast 9.9?" +
                std::string(36, 'x') + "...; this is ballast " + version() + ")");
}

TEST(PlanJson, RealPresetsRoundTrip) {
  Plan plan = base_plan();
  plan.cluster = cluster_preset("h200");
  plan.model = model_preset("llama-7b");
  const std::string text = plan_to_string(plan);
  EXPECT_EQ(plan_to_string(plan_from_json(json::parse(text), "preset.json")), text);
}

}  // namespace
}  // namespace ballast
