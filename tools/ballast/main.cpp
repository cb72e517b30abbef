// The `ballast` command line: subcommands list, plan, validate, simulate, compare, run,
// calibrate.
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "ballast/error.hpp"
#include "ballast/text.hpp"
#include "ballast/version.hpp"
#include "commands.hpp"

namespace {

using namespace ballast::cli;

constexpr const char* kMainFooter = R"(examples:
  ballast compare                                   # every strategy on the bundled defaults
  ballast compare --scenario prolong-a800           # a named, documented bundle of settings
  ballast plan --strategy hybrid-dp -o plan.json    # plan one step
  ballast validate plan.json                        # check a plan's invariants
  ballast simulate --plan plan.json --trace t.json  # predict its timeline (open t.json in ui.perfetto.dev)
  ballast simulate --strategy zeppelin --plot t.svg # draw it: one row per rank (needs matplotlib)
  ballast list                                      # names of datasets, clusters, models, strategies, scenarios
  ballast calibrate --nccl-tests ar.txt --cluster h200 -o my.json  # fit a cluster to nccl-tests output
exit codes: 0 ok, 1 invalid plan, 2 bad input or usage, 3 internal error)";

/// For a flag the command does not take ("--datset", "--strategy" on compare): one line
/// naming it and the nearest flag the command does take; "" when every flag is known.
std::string unknown_flag_message(const CLI::App& app, int argc, char** argv) {
  const CLI::App* command = &app;
  std::string command_name = "ballast";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') continue;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      if (sub->get_name() == word) {
        command = sub;
        command_name = "ballast " + word;
      }
    }
    break;  // only the first bare word can be the subcommand
  }
  std::vector<std::string> flags = {"--help"};
  for (const CLI::Option* option : command->get_options()) {
    for (const std::string& name : option->get_lnames()) flags.push_back("--" + name);
  }
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.rfind("--", 0) != 0 || word.size() == 2) continue;
    const std::string flag = word.substr(0, word.find('='));
    if (std::find(flags.begin(), flags.end(), flag) != flags.end()) continue;
    if (command == &app && flag == "--version") continue;
    return fmt::format("{}: unknown flag {}{} (see {} --help)", command_name, flag,
                       ballast::did_you_mean(flag, flags), command_name);
  }
  return "";
}

int run(int argc, char** argv) {
  CLI::App app{"ballast: plan, validate, simulate and compare balanced training steps for LLMs "
               "on variable-length data"};
  app.footer(kMainFooter);
  app.set_version_flag("--version", std::string("ballast ") + ballast::version());
  app.require_subcommand(1);

  std::string list_what;
  auto* list = app.add_subcommand("list", "list datasets, clusters, models, strategies, cost-models, scenarios");
  list->add_option("what", list_what,
                   "datasets|clusters|models|strategies|cost-models|scenarios, with descriptions, "
                   "or all of them (default: the names of each, one short list)");
  list->footer("examples:\n  ballast list\n  ballast list strategies\n  ballast list all");

  PlanArgs plan_args;
  auto* plan = app.add_subcommand("plan", "plan global batches with one strategy; writes the plan JSON");
  add_workload_flags(*plan, plan_args.workload);
  add_output_flags(*plan, plan_args.output, false);
  plan->add_option("--strategy", plan_args.strategy, "strategy, optionally with parameters: name[:key=value...] (see `ballast list strategies`) [default: ballast]");
  plan->add_option("--scenario", plan_args.scenario,
                   "take a scenario's workload settings, steps included (see `ballast list "
                   "scenarios`); flags override them");
  plan->footer("examples:\n  ballast plan --strategy packed-dp -o plan.json\n"
               "  ballast plan --strategy static-cp --degree 8 --dataset prolong --cluster a800-roce --nodes 2\n"
               "  ballast plan --strategy hybrid-dp --steps 3 -o plans.json   # a JSON array of 3 plans\n"
               "  ballast plan --scenario zeppelin-a800-7b-prolong --steps 1 -o plan.json");

  ValidateArgs validate_args;
  auto* validate = app.add_subcommand("validate", "check a plan file's invariants; prints the first violated one");
  validate->add_option("plan", validate_args.plan_path, "plan JSON (one plan or an array)")->required();
  validate->add_option("--format", validate_args.format, "text or json [default: text]");
  validate->footer("examples:\n  ballast validate plan.json\nexit code 1 when a plan is invalid");

  SimulateArgs simulate_args;
  auto* simulate = app.add_subcommand("simulate", "predict the step timeline of a plan (or of a strategy's plan)");
  add_workload_flags(*simulate, simulate_args.workload);
  add_output_flags(*simulate, simulate_args.output);
  simulate->add_option("--strategy", simulate_args.strategy, "plan with this strategy, then simulate [default without --plan: ballast]");
  simulate->add_option("--plan", simulate_args.plan_path, "simulate this plan file instead");
  simulate->add_option("--scenario", simulate_args.scenario,
                       "take a scenario's workload settings, steps included (see `ballast list "
                       "scenarios`); flags override them");
  simulate->add_option("--trace", simulate_args.trace_path,
                       "write a Chrome trace of the first step (open in ui.perfetto.dev)");
  simulate->add_option("--plot", simulate_args.plot_path,
                       "draw the first step's per-rank timeline (compute by scheme and tier, "
                       "communication, idle) to FILE.svg or FILE.png (needs python3-matplotlib)");
  simulate->footer("examples:\n  ballast simulate --strategy static-cp\n"
                   "  ballast simulate --plan plan.json --trace trace.json\n"
                   "  ballast simulate --strategy zeppelin --cluster a800-roce --plot timeline.png\n"
                   "  ballast simulate --strategy hybrid-dp --steps 4 --format csv -o ranks.csv");

  RunArgs run_args;
  auto* run_command = app.add_subcommand(
      "run", "train the runtime's model over MPI on a plan's placement (launch under mpirun -np N)");
  add_workload_flags(*run_command, run_args.workload);
  add_output_flags(*run_command, run_args.output, false);
  // run plans for the job it runs in: these are rejected, each with the reason
  // (run_command.cpp, kIgnoredFlags), so its help leaves them out (group "": hidden).
  for (const char* flag : {"--nodes", "--model", "--cost-model"}) run_command->get_option(flag)->group("");
  run_command->get_option("--cluster")->description(
      "this host's calibration: a cluster JSON written by `mpirun -np N ballast calibrate "
      "--host -o FILE` for this job [default: the cached one, measured when missing]");
  run_command->add_option("--strategy", run_args.options.strategy,
                          "strategy spec to plan each step with, or several (comma-separated): each "
                          "runs the same batches, and the report ranks them measured vs predicted "
                          "(--trace: each one's first step) [default: zeppelin]");
  run_command->add_option("--plan", run_args.options.plan_path, "run plans written by `ballast plan` instead");
  run_command->add_flag("--check", run_args.options.check,
                        "also run the single-process reference and report the largest relative "
                        "difference of the loss and every gradient tensor");
  run_command->add_flag("--recalibrate", run_args.recalibrate,
                        "measure this host again and replace the cached calibration (after one "
                        "taken while the machine was busy)");
  run_command->add_option("--trace", run_args.trace_path,
                          "write the first step's measured and predicted timelines (Chrome trace)");
  add_runtime_model_flags(*run_command, run_args.options.model);
  run_command->add_option("--expert-parallel", run_args.options.expert_parallel,
                          "with --experts: groups of this many consecutive ranks share each layer's "
                          "experts (rank m of a group owns experts e with e % N = m) [default: 1]");
  run_command->add_option("--length-scale", run_args.options.length_scale,
                          "divide sampled document lengths by this [default: 64]");
  run_command->add_option("--rank-tokens", run_args.options.rank_tokens,
                          "per-rank memory budget in tokens, for planning [default: 4096]");
  run_command->add_option("--gpus-per-node", run_args.options.gpus_per_node,
                          "ranks per emulated node [default: 2]");
  run_command->add_option("--corpus", run_args.options.corpus,
                          "text file or directory [default: /usr/share/common-licenses]");
  run_command->add_option("--learning-rate", run_args.options.adamw.learning_rate, "AdamW [default: 1e-3]");
  run_command->footer("examples:\n"
                      "  mpirun -np 4 ballast run --strategy zeppelin --check\n"
                      "  mpirun -np 2 ballast run --strategy packed-dp,static-cp,zeppelin --steps 3  # predicted vs measured order\n"
                      "  mpirun -np 8 ballast run --strategy packed-dp --dataset wlbllm --steps 3 --format json\n"
                      "  mpirun -np 4 ballast run --experts 4 --expert-parallel 2 --check  # MoE, expert parallel\n"
                      "  ballast plan --strategy hybrid-dp ... -o p.json && mpirun -np 8 ballast run --plan p.json\n"
                      "(as root add --allow-run-as-root; with more ranks than cores add --oversubscribe)");

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
  compare->add_option("--sweep", compare_args.sweep,
                      "degree=V1,V2,...: every strategy that takes a degree runs once per value "
                      "(a number or per-step; labels like static-cp:degree=16), the others once; "
                      "values a strategy cannot take are skipped with a note");
  compare->add_option("--scenario", compare_args.scenario,
                      "a named bundle of settings (see `ballast list scenarios`); flags override it");
  compare->add_option("--plot", compare_args.plot_path,
                      "draw step time per strategy with the lower bound and speedups to "
                      "FILE.svg or FILE.png (needs python3-matplotlib)");
  compare->footer("examples:\n  ballast compare\n"
                  "  ballast compare --scenario wikipedia-a100-gpt7b\n"
                  "  ballast compare --scenario zeppelin-a800-13b-wlbllm --ablation\n"
                  "  ballast compare --scenario zeppelin-a800-7b-prolong --plot compare.svg\n"
                  "  ballast compare --scenario zeppelin-a800-7b-prolong --sweep degree=per-step,16,32\n"
                  "  ballast compare --dataset prolong --cluster h200 --nodes 2 --model llama3-8b --format json\n"
                  "  ballast compare --strategies packed-dp,hybrid-dp --baseline packed-dp --steps 8 --format csv");

  CalibrateArgs calibrate_args;
  auto* calibrate = app.add_subcommand(
      "calibrate", "fit a cluster's collective latency and bandwidth to nccl-tests results; "
                   "writes the cluster JSON, prints measured vs fitted times");
  calibrate->add_option("--nccl-tests", calibrate_args.nccl_tests_files,
                        "nccl-tests output (all_reduce_perf, all_gather_perf, reduce_scatter_perf, "
                        "alltoall_perf, sendrecv_perf) or a CSV like "
                        "data/profiles/h200_8gpu_nccl_tests.csv; several files allowed");
  calibrate->add_flag("--host", calibrate_args.host,
                      "measure this machine instead, under mpirun with the ranks `ballast run` "
                      "will use: the runtime's GEMMs and attention kernel, MPI point-to-point and "
                      "collectives; writes the cluster `ballast run` plans on (-o, or the cache "
                      "ballast run reads)");
  add_runtime_model_flags(*calibrate, calibrate_args.model, "with --host: ");
  calibrate->add_option("--attention", calibrate_args.attention_path,
                        "attention kernel benchmark CSV (columns seq_len_tokens, pass, time_s, "
                        "heads, head_dim[, batch]): replaces the attention efficiency curves");
  calibrate->add_option("--cluster", calibrate_args.cluster,
                        "base cluster (preset or JSON file) whose constants are replaced [default: h100]");
  calibrate->add_option("--name", calibrate_args.name, "name of the calibrated cluster [default: <base>-calibrated]");
  calibrate->add_option("-o,--output", calibrate_args.output_path, "write the calibrated cluster JSON to FILE");
  calibrate->add_option("--format", calibrate_args.format, "rows table on stdout: text or json [default: text]");
  calibrate->footer(
      "examples:\n"
      "  ballast calibrate --nccl-tests data/profiles/h200_8gpu_nccl_tests.csv --cluster h200 -o h200-cal.json\n"
      "  all_reduce_perf -b 8M -e 8G -f 2 -g 8 > ar.txt; all_gather_perf -b 8M -e 8G -f 2 -g 8 > ag.txt\n"
      "  ballast calibrate --nccl-tests ar.txt ag.txt --cluster h100 -o mine.json --format json\n"
      "  ballast calibrate --nccl-tests ar.txt --attention attn.csv --cluster h100 -o mine.json\n"
      "  mpirun -np 2 ballast calibrate --host -o host.json   # then: mpirun -np 2 ballast run --cluster host.json\n"
      "  ballast compare --cluster mine.json");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);
    const std::string unknown_flag = unknown_flag_message(app, argc, argv);
    if (!unknown_flag.empty()) {
      std::cerr << unknown_flag << "\n";
      return kExitBadInput;
    }
    std::cerr << "ballast: " << error.what() << " (see ballast --help)\n";
    return kExitBadInput;
  }
  if (list->parsed()) return run_list(list_what, std::cout);
  if (plan->parsed()) return run_plan(plan_args);
  if (validate->parsed()) return run_validate(validate_args);
  if (calibrate->parsed()) {
    calibrate_args.flags_given.clear();
    for (const CLI::Option* option : calibrate->get_options()) {
      if (option->count() > 0) calibrate_args.flags_given.push_back(option->get_name());
    }
    return calibrate_args.host ? run_calibrate_host(calibrate_args) : run_calibrate(calibrate_args);
  }
  if (simulate->parsed()) return run_simulate(simulate_args);
  if (run_command->parsed()) {
    for (const CLI::Option* option : run_command->get_options()) {
      // By its long name: get_name() is "" for the options hidden from the help above.
      if (option->count() > 0 && !option->get_lnames().empty()) {
        run_args.flags_given.push_back("--" + option->get_lnames().front());
      }
    }
    return run_run(run_args);
  }
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
