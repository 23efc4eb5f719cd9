// malle-alloc: solves one allocation problem given as JSON (docs/allocator-json.md).
//
//   malle-alloc solve [--policy=milp] [--time_limit=1s] [--isolation=fork] [--compact] problem.json
//   malle-alloc validate problem.json
//
// PROBLEM is a file or `-` for stdin. `solve` prints the decision JSON on
// stdout; `validate` prints "ok: N jobs, M nodes, K pools". Errors go to
// stderr. Exit codes: 0 ok, 2 bad input (flags, arguments, an unreadable file,
// an invalid problem; the message names the field), 1 anything else.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "libmalle/alloc/count_model.h"
#include "libmalle/alloc/decide.h"
#include "libmalle/alloc/problem.h"
#include "libmalle/alloc/problem_json.h"

ABSL_FLAG(std::string, policy, "milp", "milp, dp, greedy, equal_share or static");
ABSL_FLAG(absl::Duration, time_limit, absl::Seconds(1),
          "wall-clock limit of a decision with the MILP, compiling the problem included "
          "(the MILP gets the rest), e.g. 500ms, 2s");
ABSL_FLAG(std::string, isolation, "fork",
          "fork (CBC in a child process, crash- and hang-proof) or in_process");
ABSL_FLAG(bool, compact, false, "print the decision on one line");

namespace {

constexpr int kExitOk = 0;
constexpr int kExitError = 1;
constexpr int kExitBadInput = 2;

constexpr char kUsage[] =
    "solves an allocation problem given as JSON\n"
    "\n"
    "  malle-alloc solve [--policy=milp|dp|greedy|equal_share|static] [--time_limit=1s]\n"
    "                    [--isolation=fork|in_process] [--compact] PROBLEM\n"
    "  malle-alloc validate PROBLEM\n"
    "\n"
    "PROBLEM is a JSON file (docs/allocator-json.md) or - for stdin.\n"
    "Exit codes: 0 ok, 2 bad input, 1 other errors.";

// The flags of this tool; a mistyped one is refused before absl sees it.
constexpr absl::string_view kOwnFlags[] = {"policy", "time_limit", "isolation", "compact"};
// absl's usage flags, which absl handles without registering them as flags.
constexpr absl::string_view kUsageFlags[] = {
    "help",   "helpfull",  "helpshort",       "helppackage",
    "helpon", "helpmatch", "only_check_args", "version"};

int Fail(int code, absl::string_view message) {
  std::cerr << "malle-alloc: " << message << "\n";
  return code;
}

// absl::ParseCommandLine reports an unknown flag or a bad value with exit
// code 1, which this tool reserves for failures that are not the caller's.
// So flags are checked here first, with exit code 2 and the list of flags.
// Returns the exit code, or -1 when the command line is fine.
int CheckFlags(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;  // the rest are positional
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    const size_t eq = arg.find('=');
    const absl::string_view name = arg.substr(0, eq);
    if (std::find(std::begin(kUsageFlags), std::end(kUsageFlags), name) != std::end(kUsageFlags)) {
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      negated = flag != nullptr && flag->IsOfType<bool>();
      if (!negated) flag = nullptr;
    }
    if (flag == nullptr) {
      return Fail(kExitBadInput,
                  absl::StrCat("unknown flag '", argv[i],
                               "'; flags are --policy, --time_limit, --isolation, --compact "
                               "(--help for details)"));
    }
    // Only our own flags' values are checked here; absl's (--help,
    // --flagfile...) are handled by absl.
    bool own = false;
    for (absl::string_view own_name : kOwnFlags) own = own || flag->Name() == own_name;
    if (!own || negated) continue;
    std::string value;
    if (eq != absl::string_view::npos) {
      value = std::string(arg.substr(eq + 1));
    } else if (flag->IsOfType<bool>()) {
      continue;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return Fail(kExitBadInput, absl::StrCat("flag --", flag->Name(), " needs a value"));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return Fail(
          kExitBadInput,
          absl::StrCat("--", flag->Name(), "=", value, ": ", error,
                       flag->Name() == "time_limit" ? " (a duration such as 500ms or 2s)" : ""));
    }
  }
  return -1;
}

absl::StatusOr<std::string> ReadInput(const std::string& path) {
  std::ostringstream text;
  if (path == "-") {
    text << std::cin.rdbuf();
    if (std::cin.bad()) return absl::InvalidArgumentError("cannot read stdin");
    return text.str();
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::InvalidArgumentError(absl::StrCat("cannot open '", path, "'"));
  text << file.rdbuf();
  if (file.bad()) return absl::InvalidArgumentError(absl::StrCat("cannot read '", path, "'"));
  return text.str();
}

// Bad input prints its message (it names the field); anything else also its code.
int FailStatus(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument ? Fail(kExitBadInput, status.message())
                                                             : Fail(kExitError, status.ToString());
}

int Validate(const std::string& text) {
  absl::StatusOr<malle::alloc::Problem> problem = malle::alloc::ParseProblemJson(text);
  if (!problem.ok()) return FailStatus(problem.status());
  absl::StatusOr<malle::alloc::CountModel> model = malle::alloc::CompileCountModel(*problem);
  if (!model.ok()) return FailStatus(model.status());
  std::cout << "ok: " << problem->jobs.size() << " jobs, " << problem->nodes.size() << " nodes, "
            << model->pools.size() << " pools\n";
  return kExitOk;
}

int Solve(const std::string& text) {
  malle::alloc::DecideOptions options;
  absl::StatusOr<malle::alloc::PolicyKind> policy =
      malle::alloc::ParsePolicyName(absl::GetFlag(FLAGS_policy));
  if (!policy.ok()) {
    // ParsePolicyName's message starts with the field name, "policy: ".
    absl::string_view message = policy.status().message();
    absl::ConsumePrefix(&message, "policy: ");
    return Fail(kExitBadInput, absl::StrCat("--policy: ", message));
  }
  options.policy = *policy;
  const absl::Duration time_limit = absl::GetFlag(FLAGS_time_limit);
  if (time_limit <= absl::ZeroDuration() || time_limit == absl::InfiniteDuration()) {
    return Fail(kExitBadInput, absl::StrCat("--time_limit: must be a finite duration > 0, got ",
                                            absl::FormatDuration(time_limit)));
  }
  options.milp.time_limit = time_limit;
  const std::string isolation = absl::GetFlag(FLAGS_isolation);
  if (isolation == "fork") {
    options.milp.isolation = malle::alloc::SolveIsolation::kFork;
  } else if (isolation == "in_process") {
    options.milp.isolation = malle::alloc::SolveIsolation::kInProcess;
  } else {
    return Fail(kExitBadInput,
                absl::StrCat("--isolation: expected fork or in_process, got '", isolation, "'"));
  }

  absl::StatusOr<malle::alloc::Problem> problem = malle::alloc::ParseProblemJson(text);
  if (!problem.ok()) return FailStatus(problem.status());
  absl::StatusOr<malle::alloc::Decision> decision = malle::alloc::Decide(*problem, options);
  if (!decision.ok()) return FailStatus(decision.status());
  std::cout << malle::alloc::DecisionToJson(*problem, *decision,
                                            absl::GetFlag(FLAGS_compact) ? -1 : 2)
            << "\n";
  std::cout.flush();
  return std::cout ? kExitOk : Fail(kExitError, "cannot write the decision to stdout");
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  // --help lists the flags of the file holding main; absl guesses that file
  // from the program name, which malle-alloc does not match.
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "alloc_main.cc");
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  if (const int code = CheckFlags(argc, argv); code >= 0) return code;
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() < 2)
    return Fail(kExitBadInput, absl::StrCat("missing command\n\nusage: ", kUsage));
  const std::string command = rest[1];
  if (command != "solve" && command != "validate") {
    return Fail(kExitBadInput,
                absl::StrCat("unknown command '", command, "'; expected solve or validate"));
  }
  if (rest.size() != 3) {
    return Fail(kExitBadInput, absl::StrCat(command,
                                            ": expected exactly one PROBLEM argument (a "
                                            "JSON file or - for stdin), got ",
                                            rest.size() - 2));
  }
  absl::StatusOr<std::string> text = ReadInput(rest[2]);
  if (!text.ok()) return Fail(kExitBadInput, text.status().message());
  return command == "solve" ? Solve(*text) : Validate(*text);
}
