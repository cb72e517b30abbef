// The `ballast` command line: subcommands list, plan, validate, simulate, compare.
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "ballast/error.hpp"
#include "commands.hpp"

namespace {

using namespace ballast::cli;

constexpr const char* kMainFooter = R"(examples:
  ballast compare                                   # every strategy on the bundled defaults
  ballast compare --scenario prolong-a800           # a named, documented bundle of settings
  ballast plan --strategy hybrid-dp -o plan.json    # plan one step
  ballast validate plan.json                        # check a plan's invariants
  ballast simulate --plan plan.json --trace t.json  # predict its timeline (open t.json in ui.perfetto.dev)
  ballast list                                      # datasets, clusters, models, strategies, scenarios
exit codes: 0 ok, 1 invalid plan, 2 bad input or usage, 3 internal error)";

int run(int argc, char** argv) {
  CLI::App app{"ballast: plan, validate, simulate and compare balanced training steps for LLMs "
               "on variable-length data"};
  app.footer(kMainFooter);
  app.require_subcommand(1);

  std::string list_what;
  auto* list = app.add_subcommand("list", "list datasets, clusters, models, strategies, cost-models, scenarios");
  list->add_option("what", list_what, "datasets|clusters|models|strategies|cost-models|scenarios (default: all)");
  list->footer("examples:\n  ballast list\n  ballast list strategies");

  PlanArgs plan_args;
  auto* plan = app.add_subcommand("plan", "plan global batches with one strategy; writes the plan JSON");
  add_workload_flags(*plan, plan_args.workload);
  add_output_flags(*plan, plan_args.output, false);
  plan->add_option("--strategy", plan_args.strategy, "strategy, optionally with parameters: name[:key=value...] (see `ballast list strategies`)")->required();
  plan->footer("examples:\n  ballast plan --strategy packed-dp -o plan.json\n"
               "  ballast plan --strategy static-cp --degree 8 --dataset prolong --cluster a800-roce --nodes 2\n"
               "  ballast plan --strategy hybrid-dp --steps 3 -o plans.json   # a JSON array of 3 plans");

  ValidateArgs validate_args;
  auto* validate = app.add_subcommand("validate", "check a plan file's invariants; prints the first violated one");
  validate->add_option("plan", validate_args.plan_path, "plan JSON (one plan or an array)")->required();
  validate->add_option("--format", validate_args.format, "text or json [default: text]");
  validate->footer("examples:\n  ballast validate plan.json\nexit code 1 when a plan is invalid");

  SimulateArgs simulate_args;
  auto* simulate = app.add_subcommand("simulate", "predict the step timeline of a plan (or of a strategy's plan)");
  add_workload_flags(*simulate, simulate_args.workload);
  add_output_flags(*simulate, simulate_args.output);
  simulate->add_option("--strategy", simulate_args.strategy, "plan with this strategy, then simulate");
  simulate->add_option("--plan", simulate_args.plan_path, "simulate this plan file instead");
  simulate->add_option("--trace", simulate_args.trace_path,
                       "write a Chrome trace of the first step (open in ui.perfetto.dev)");
  simulate->footer("examples:\n  ballast simulate --strategy static-cp\n"
                   "  ballast simulate --plan plan.json --trace trace.json\n"
                   "  ballast simulate --strategy hybrid-dp --steps 4 --format csv -o ranks.csv");

  CompareArgs compare_args;
  auto* compare = app.add_subcommand("compare", "compare strategies on the same batches: step time, gap to "
                                                "the lower bound, speedup, imbalance, memory, planner latency");
  add_workload_flags(*compare, compare_args.workload);
  add_output_flags(*compare, compare_args.output);
  compare->add_option("--strategies", compare_args.strategies, "comma-separated strategies, each name[:key=value...], e.g. static-ulysses:degree=32 [default: all]");
  compare->add_option("--baseline", compare_args.baseline,
                      "strategy the speedup is measured against [default: static-cp]");
  compare->add_flag("--ablation", compare_args.ablation,
                    "Zeppelin's ablation ladder in one table: static-cp, then zeppelin with even "
                    "splitting, + routing, + hierarchical partitioning, + remapping, and without "
                    "routing (docs/zeppelin.md)");
  compare->add_option("--scenario", compare_args.scenario,
                      "a named bundle of settings (see `ballast list scenarios`); flags override it");
  compare->footer("examples:\n  ballast compare\n"
                  "  ballast compare --scenario wikipedia-a100-gpt7b\n"
                  "  ballast compare --scenario zeppelin-a800-13b-wlbllm --ablation\n"
                  "  ballast compare --dataset prolong --cluster h200 --nodes 2 --model llama3-8b --format json\n"
                  "  ballast compare --strategies packed-dp,hybrid-dp --baseline packed-dp --steps 8 --format csv");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);
    std::cerr << "ballast: " << error.what() << " (see ballast --help)\n";
    return kExitBadInput;
  }
  if (list->parsed()) return run_list(list_what, std::cout);
  if (plan->parsed()) return run_plan(plan_args);
  if (validate->parsed()) return run_validate(validate_args);
  if (simulate->parsed()) return run_simulate(simulate_args);
  return run_compare(compare_args);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const ballast::InputError& error) {
    std::cerr << "ballast: error: " << error.what() << "\n";
    return kExitBadInput;
  } catch (const std::exception& error) {
    std::cerr << "ballast: internal error (please report): " << error.what() << "\n";
    return kExitInternal;
  }
}
