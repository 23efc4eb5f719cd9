// nas_search: a tiny neural-architecture search driven from C++ through the
// allocator's client API (libmalle/control/service/client.h), the way a NAS or HPO
// framework would use malletrain.
//
// It submits one elastic trial per hidden width of the digits classifier
// (examples/train_digits.py), all sharing the allocator's idle nodes; each
// trial grows and shrinks as the allocator decides. It waits for every trial,
// prints each one's outcome and its advisor's scalability report, and picks
// the best width by test accuracy (read from the trial's result file).
//
//   # a deployment: `malletrain store`, `malletrain allocator`, agents; or any
//   # LocalCluster, e.g. python -c "..." (tests/python/test_cluster.py does it)
//   nas_search --store=127.0.0.1:29400 --secret=/path/to/secret \
//       --python=.venv/bin/python --script=examples/train_digits.py \
//       --widths=32,64,128 --steps=150 --out=/tmp/nas
//
// Exit codes: 0 every trial succeeded, 1 a trial failed or timed out, 2 bad flags.
//
// Built by malletrain's own build, or on its own against the installed C++ package:
// examples/nas_search/CMakeLists.txt (find_package(malle), docs/install.md).
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "libmalle/advisor/report_json.h"
#include "libmalle/control/service/client.h"
#include "libmalle/control/wire/secret.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, store, "", "control store HOST:PORT");
ABSL_FLAG(std::string, secret, "", "the deployment's secret file");
ABSL_FLAG(std::string, python, "python3", "interpreter for the trials");
ABSL_FLAG(std::string, script, "examples/train_digits.py", "the trial program");
ABSL_FLAG(std::string, widths, "32,64,128", "hidden widths to try, one trial each");
ABSL_FLAG(int, steps, 150, "training steps per trial");
ABSL_FLAG(int, max_nodes, 2, "most nodes a trial may use (its logical workers)");
ABSL_FLAG(std::string, out, "/tmp/nas", "each trial writes <out>/<trial>/result.json");
ABSL_FLAG(std::string, prefix, "nas", "trial job ids are <prefix>-w<width>");
ABSL_FLAG(absl::Duration, timeout, absl::Minutes(20), "give up after this long");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("submits one elastic trial per width and picks the best");
  absl::ParseCommandLine(argc, argv);
  std::vector<std::string> hp = absl::StrSplit(absl::GetFlag(FLAGS_store), absl::MaxSplits(':', 1));
  int port = 0;
  if (hp.size() != 2 || !absl::SimpleAtoi(hp[1], &port)) {
    std::cerr << "nas_search: --store must be HOST:PORT\n";
    return 2;
  }
  absl::StatusOr<malle::control::Secret> secret = malle::control::LoadSecret(absl::GetFlag(FLAGS_secret));
  if (!secret.ok()) {
    std::cerr << "nas_search: " << secret.status() << "\n";
    return 2;
  }
  std::vector<int> widths;
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_widths), ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(w, &v) || v < 1) {
      std::cerr << "nas_search: --widths: '" << w << "' is not a positive integer\n";
      return 2;
    }
    widths.push_back(v);
  }
  absl::StatusOr<std::unique_ptr<malle::control::Client>> client =
      malle::control::Client::Connect(hp[0], port, *secret);
  if (!client.ok()) {
    std::cerr << "nas_search: " << client.status() << "\n";
    return 1;
  }

  // Submit every trial at once: the allocator shares the nodes among them.
  std::vector<std::string> trials;
  const int max_nodes = absl::GetFlag(FLAGS_max_nodes);
  for (int w : widths) {
    malle::control::JobSubmit trial;
    trial.job = absl::StrCat(absl::GetFlag(FLAGS_prefix), "-w", w);
    const std::string out = absl::StrCat(absl::GetFlag(FLAGS_out), "/", trial.job);
    trial.command = {absl::GetFlag(FLAGS_python), absl::GetFlag(FLAGS_script), "--hidden", absl::StrCat(w),
                     "--steps", absl::StrCat(absl::GetFlag(FLAGS_steps)), "--logical-workers",
                     absl::StrCat(max_nodes), "--out", out};
    trial.min_nodes = 1;
    trial.max_nodes = max_nodes;
    trial.logical_workers = max_nodes;
    absl::Status s = (*client)->Submit(trial);
    if (!s.ok()) {
      std::cerr << "nas_search: submitting " << trial.job << ": " << s << "\n";
      return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    std::cout << "submitted " << trial.job << std::endl;
    trials.push_back(trial.job);
  }

  // Watch them: one line whenever a trial's size or phase changes.
  const absl::Time deadline = absl::Now() + absl::GetFlag(FLAGS_timeout);
  std::map<std::string, std::string> last;
  bool all_ended = false;
  while (!all_ended && absl::Now() < deadline) {
    all_ended = true;
    absl::StatusOr<std::vector<malle::control::JobView>> jobs = (*client)->Jobs();
    if (!jobs.ok()) {
      all_ended = false;
      absl::SleepFor(absl::Milliseconds(500));
      continue;
    }
    for (const std::string& t : trials) {
      const malle::control::JobView* v = nullptr;
      for (const auto& j : *jobs) v = j.job == t ? &j : v;
      if (v == nullptr || !v->ended()) all_ended = false;
      if (v == nullptr) continue;
      const std::string now = absl::StrCat(v->phase, " on ", v->nodes, " node(s)");
      if (last[t] != now) std::cout << t << ": " << now << " (step " << v->step << ")" << std::endl;
      last[t] = now;
    }
    absl::SleepFor(absl::Milliseconds(500));
  }
  if (!all_ended) {
    std::cerr << "nas_search: trials did not end within " << absl::GetFlag(FLAGS_timeout) << "\n";
    return 1;
  }

  int exit_code = 0;
  std::string best;
  double best_accuracy = -1;
  for (size_t i = 0; i < trials.size(); ++i) {
    absl::StatusOr<malle::control::JobView> v = (*client)->Job(trials[i]);
    const std::string phase = v.ok() ? v->phase : v.status().ToString();
    std::ifstream in(absl::StrCat(absl::GetFlag(FLAGS_out), "/", trials[i], "/result.json"));
    nlohmann::json result = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    const double accuracy = result.is_object() ? result.value("accuracy", -1.0) : -1.0;
    std::cout << trials[i] << " (width " << widths[i] << "): " << phase << ", test accuracy " << accuracy
              << "\n";
    if (phase != "succeeded") exit_code = 1;
    if (accuracy > best_accuracy) best_accuracy = accuracy, best = trials[i];
    absl::StatusOr<std::optional<malle::advisor::AdvisorReport>> report = (*client)->Report(trials[i]);
    if (report.ok() && report->has_value()) std::cout << malle::advisor::FormatReportTable(**report) << "\n";
  }
  std::cout << "best: " << best << " (test accuracy " << best_accuracy << ")" << std::endl;
  return exit_code;
}
