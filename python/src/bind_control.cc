// malletrain._C bindings of libmalle/control: secrets, the allocator service
// (embedded mode), the node agent, the client, and the outbox jobs use for
// their reports. Options arrive as keyword arguments whose defaults live in
// malletrain/cluster.py; blocking calls release the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "libmalle/advisor/report_json.h"
#include "libmalle/alloc/decide.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/control/service/agent.h"
#include "libmalle/control/service/allocator_service.h"
#include "libmalle/control/service/channel.h"
#include "libmalle/control/service/client.h"
#include "libmalle/control/wire/envelope.h"
#include "libmalle/control/wire/messages.h"
#include "libmalle/control/wire/secret.h"
#include "python/src/bind_common.h"

namespace malle::python {
namespace {

namespace py = pybind11;
using comm::ControlStore;
using control::Secret;

absl::Duration Secs(double s, const char* name) {
  if (!std::isfinite(s) || s < 0) {
    throw StatusError(absl::InvalidArgumentError(
        absl::StrCat(name, ": expected a finite number of seconds >= 0, got ", s)));
  }
  return absl::Seconds(s);
}

// Holds a running service so that Python's garbage collector cannot destroy
// it under its own thread; stop() joins it.
struct Service {
  std::unique_ptr<control::AllocatorService> service;
};

}  // namespace

void BindControl(py::module_& m) {
  m.def(
      "open_store",
      [](const std::string& address, double timeout_s) {
        const absl::Duration timeout = Secs(timeout_s, "timeout");
        py::gil_scoped_release release;
        return ValueOrThrow(ControlStore::Open(address, timeout));
      },
      py::arg("address"), py::arg("timeout") = 30.0,
      "Connects to the control store at `address`: 'host:port' (a TCPStore server) or "
      "'etcd://h1:p1,h2:p2,...[/ns]' (an etcd cluster).");
  m.def(
      "store_address", [](const ControlStore& s) { return s.address(); }, py::arg("store"),
      "What open_store takes to reach this store ('' for an in-memory one).");
  py::class_<Secret>(m, "Secret", "A shared secret (its bytes are never shown).")
      .def("__repr__", &Secret::Redacted);
  m.def(
      "load_secret", [](const std::string& path) { return ValueOrThrow(control::LoadSecret(path)); },
      py::arg("path"), "Loads a secret file (must be mode 0600/0400, owned by this user).");
  m.def(
      "write_new_secret",
      [](const std::string& path) { ThrowIfError(control::WriteNewSecret(path)); }, py::arg("path"),
      "Creates a new random secret file (mode 0600); fails if it exists.");

  m.def(
      "sign_control_message",
      [](const Secret& secret, const std::string& sender, uint64_t seq, double ts, const std::string& type,
         const std::string& body_json) {
        const control::MessageType t = ValueOrThrow(control::ParseMessageType(type));
        control::Message message = ValueOrThrow(control::DecodeBody(t, body_json));
        return ValueOrThrow(control::Sign(message, secret, sender, seq,
                                          absl::FromUnixMicros(static_cast<int64_t>(std::llround(ts * 1e6)))));
      },
      py::arg("secret"), py::arg("sender"), py::arg("seq"), py::arg("ts"), py::arg("type"), py::arg("body_json"),
      "Signs one control message (body as JSON, docs/protocol.md) and returns its wire text. "
      "Raises ValueError naming the field for an invalid message.");

  py::class_<Service>(m, "AllocatorService", "The allocator loop on a thread of this process.")
      .def(py::init([](std::shared_ptr<ControlStore> store, const Secret& secret,
                       const std::string& policy, const std::string& journal,
                       double forward_window_s, double heartbeat_timeout_s, double debounce_s,
                       double report_min_interval_s, double default_samples_per_s,
                       int max_rank_failures, const std::string& objective,
                       double resize_hysteresis, double rank_weight_exponent, bool reclaim_hazard,
                       double rank_aging_s) {
             control::AllocatorServiceOptions o;
             o.decide.policy = ValueOrThrow(alloc::ParsePolicyName(policy));
             o.journal_path = journal;
             o.state.forward_window = Secs(forward_window_s, "forward_window");
             o.state.heartbeat_timeout = Secs(heartbeat_timeout_s, "heartbeat_timeout");
             o.state.default_samples_per_s = default_samples_per_s;
             o.state.max_rank_failures = max_rank_failures;
             o.state.objective = ValueOrThrow(alloc::ParseObjectiveName(objective));
             o.state.resize_hysteresis = resize_hysteresis;
             o.state.rank_weight_exponent = rank_weight_exponent;
             // Infinite: off; Validate() names any other value that is not > 0.
             o.state.rank_aging = std::isinf(rank_aging_s) && rank_aging_s > 0
                                      ? absl::InfiniteDuration()
                                      : Secs(rank_aging_s, "rank_aging");
             o.state.reclaim_hazard = reclaim_hazard;
             o.debounce = Secs(debounce_s, "debounce");
             o.report_min_interval = Secs(report_min_interval_s, "report_min_interval");
             py::gil_scoped_release release;
             return Service{ValueOrThrow(control::AllocatorService::Create(std::move(store), secret, o))};
           }),
           py::arg("store"), py::arg("secret"), py::arg("policy"), py::arg("journal"),
           py::arg("forward_window_s"), py::arg("heartbeat_timeout_s"), py::arg("debounce_s"),
           py::arg("report_min_interval_s"), py::arg("default_samples_per_s"),
           py::arg("max_rank_failures"), py::arg("objective"), py::arg("resize_hysteresis") = 1.0,
           py::arg("rank_weight_exponent") = 0.0, py::arg("reclaim_hazard") = false,
           py::arg("rank_aging_s") = std::numeric_limits<double>::infinity())
      .def(
          "start", [](Service& s) { ThrowIfError(s.service->Start()); },
          "Starts the loop on a background thread.")
      .def(
          "stop",
          [](Service& s) {
            py::gil_scoped_release release;
            ThrowIfError(s.service->Stop());
          },
          "Stops the loop (at most one decision later); raises what ended it, if anything did.")
      .def("status_json", [](Service& s) { return s.service->StatusJson(); })
      .def(
          "metrics_text", [](Service& s) { return s.service->MetricsText(); },
          "The allocator's metrics in Prometheus' text format (docs/operations.md).")
      .def("stats", [](Service& s) {
        control::AllocatorStats st = s.service->stats();
        py::dict d;
        d["accepted"] = st.accepted;
        d["rejected"] = st.rejected;
        d["holes_skipped"] = st.holes_skipped;
        d["decisions"] = st.decisions;
        d["epoch"] = st.epoch;
        d["inbox_position"] = st.cursor;
        d["last_rejection"] = st.last_rejection;
        d["decision_ms"] = std::vector<double>(st.decision_ms.begin(), st.decision_ms.end());
        return d;
      });

  py::class_<control::Agent>(m, "Agent", "A node agent (run() blocks until stop() or a reclaim).")
      .def("metrics_text", &control::Agent::MetricsText)
      .def(py::init([](std::shared_ptr<ControlStore> store, const Secret& secret, const std::string& node,
                       const std::string& store_address, const std::string& secret_path,
                       const std::string& log_dir, const std::string& group, double speed,
                       py::object idle_until, double leave_timeout_s,
                       std::vector<std::pair<std::string, std::string>> extra_env) {
             control::AgentOptions o;
             o.node = node;
             o.store_address = store_address;
             o.secret_path = secret_path;
             o.log_dir = log_dir;
             o.node_class = control::NodeClass{group, speed};
             if (!idle_until.is_none()) o.idle_until = absl::FromUnixMicros(
                 static_cast<int64_t>(std::llround(idle_until.cast<double>() * 1e6)));
             o.leave_timeout = Secs(leave_timeout_s, "leave_timeout");
             o.extra_env = std::move(extra_env);
             return ValueOrThrow(control::Agent::Create(std::move(store), secret, o)).release();
           }),
           py::arg("store"), py::arg("secret"), py::arg("node"), py::arg("store_address"),
           py::arg("secret_path"), py::arg("log_dir"), py::arg("group"), py::arg("speed"),
           py::arg("idle_until"), py::arg("leave_timeout_s"), py::arg("extra_env"))
      .def(
          "run",
          [](control::Agent& a) {
            py::gil_scoped_release release;
            ThrowIfError(a.Run());
          },
          "Runs the agent until stop() or a completed reclaim (releases the GIL).")
      .def(
          "reclaim", [](control::Agent& a, double grace_s, const std::string& reason) {
            a.Reclaim(Secs(grace_s, "grace"), reason);
          },
          py::arg("grace_s"), py::arg("reason"))
      .def(
          "stop", [](control::Agent& a, const std::string& reason) { a.Stop(reason); },
          py::arg("reason") = "stopped")
      .def_property_readonly("agent_id", &control::Agent::agent_id)
      .def_property_readonly("plan_seen", &control::Agent::plan_seen);

  py::class_<control::Client>(m, "ControlClient", "Submits jobs and reads the allocator's status.")
      .def(py::init([](std::shared_ptr<ControlStore> store, const Secret& secret) {
             return ValueOrThrow(control::Client::Over(std::move(store), secret)).release();
           }),
           py::arg("store"), py::arg("secret"))
      .def(
          "submit",
          [](control::Client& c, const std::string& job, std::vector<std::string> command,
             std::map<std::string, std::string> env, const std::string& cwd, int min_nodes,
             int max_nodes, std::optional<int> logical_workers, double weight, int priority,
             std::optional<int64_t> total_steps) {
            control::JobSubmit s;
            s.job = job;
            s.command = std::move(command);
            s.env = std::move(env);
            s.cwd = cwd;
            s.min_nodes = min_nodes;
            s.max_nodes = max_nodes;
            s.logical_workers = logical_workers;
            s.weight = weight;
            s.priority = priority;
            s.total_steps = total_steps;
            py::gil_scoped_release release;
            ThrowIfError(c.Submit(s));
          },
          py::arg("job"), py::arg("command"), py::arg("env"), py::arg("cwd"), py::arg("min_nodes"),
          py::arg("max_nodes"), py::arg("logical_workers"), py::arg("weight"), py::arg("priority"),
          py::arg("total_steps") = py::none())
      .def(
          "cancel",
          [](control::Client& c, const std::string& job, const std::string& reason) {
            py::gil_scoped_release release;
            ThrowIfError(c.Cancel(job, reason));
          },
          py::arg("job"), py::arg("reason"))
      .def("status_json",
           [](control::Client& c) {
             py::gil_scoped_release release;
             return ValueOrThrow(c.StatusJson());
           })
      .def(
          "report_json",
          [](control::Client& c, const std::string& job) -> std::optional<std::string> {
            absl::StatusOr<std::optional<advisor::AdvisorReport>> r;
            {
              py::gil_scoped_release release;
              r = c.Report(job);
            }
            std::optional<advisor::AdvisorReport> report = ValueOrThrow(std::move(r));
            if (!report) return std::nullopt;
            return advisor::ReportToJson(*report);
          },
          py::arg("job"));

  py::class_<control::Outbox>(m, "Outbox", "Signs control messages and sends them to the allocator.")
      .def(py::init([](std::shared_ptr<ControlStore> store, const Secret& secret, const std::string& sender) {
             ThrowIfError(control::ValidateId("sender", sender));
             return new control::Outbox(std::move(store), secret, sender);
           }),
           py::arg("store"), py::arg("secret"), py::arg("sender"))
      .def(
          "send_advisor_report",
          [](control::Outbox& o, const std::string& job, const std::string& report_json) {
            py::gil_scoped_release release;
            ThrowIfError(o.Send(control::AdvisorReport{job, report_json}));
          },
          py::arg("job"), py::arg("report_json"))
      .def(
          "send_job_complete",
          [](control::Outbox& o, const std::string& job, const std::string& status, int64_t steps,
             int64_t samples, const std::string& message) {
            control::JobComplete c;
            c.job = job;
            if (status == "succeeded") {
              c.status = control::JobStatus::kSucceeded;
            } else if (status == "failed") {
              c.status = control::JobStatus::kFailed;
            } else if (status == "cancelled") {
              c.status = control::JobStatus::kCancelled;
            } else {
              throw StatusError(absl::InvalidArgumentError(
                  absl::StrCat("status: expected succeeded, failed or cancelled, got '", status, "'")));
            }
            c.steps = steps;
            c.samples = samples;
            c.message = message;
            py::gil_scoped_release release;
            ThrowIfError(o.Send(c));
          },
          py::arg("job"), py::arg("status"), py::arg("steps"), py::arg("samples"), py::arg("message"));
}

}  // namespace malle::python
