// Bindings of libmalle/comm: the control store, the elastic group and the
// collectives of its current generation (launchers, tests and tools use them;
// training goes through the engine, bind_elastic.cc). Tensors cross as
// torch.Tensor (torch's own pybind11 casters).
//
// Every call that can block (store, rendezvous, collectives, step boundary)
// releases the GIL, so a Python thread can wait on one collective while the
// training thread issues the next (the DDP comm hook does exactly that).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "libmalle/comm/backend.h"
#include "libmalle/comm/communicator.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/comm/elastic_group.h"
#include "python/src/bind_common.h"

namespace py = pybind11;

namespace malle::python {
namespace {

using comm::ControlStore;
using comm::ElasticGroup;
using comm::ElasticGroupOptions;
using comm::PendingCollective;
using comm::ReduceOp;
using comm::Transition;

absl::Duration Seconds(double s, const char* field) {
  if (!(s > 0) || s > 1e9) {
    ThrowIfError(absl::InvalidArgumentError(
        absl::StrCat(field, ": must be a positive number of seconds, got ", s)));
  }
  return absl::Seconds(s);
}

ReduceOp ParseOp(const std::string& op) {
  if (op == "sum") return ReduceOp::kSum;
  if (op == "max") return ReduceOp::kMax;
  if (op == "min") return ReduceOp::kMin;
  if (op == "product") return ReduceOp::kProduct;
  ThrowIfError(absl::InvalidArgumentError(
      absl::StrCat("op: got '", op, "'; expected one of sum, max, min, product")));
  return ReduceOp::kSum;
}

// The group's Communicator, or a clear error once it has none.
comm::Communicator& CommOf(ElasticGroup& g) {
  if (!g.active()) {
    ThrowIfError(absl::FailedPreconditionError(
        absl::StrCat("member ", g.member_id(), " is no longer in job ", g.job_id(),
                     " (", TransitionKindName(g.last_transition().kind), ")")));
  }
  return g.comm();
}

// The tensors a collective hands to libmalle, as aliases without a Python object.
//
// c10d's threads keep a collective's tensors after the call returns: a Gloo worker until the
// work is destroyed, and a work left behind by a failed generation until Gloo gives up on it
// (the reaper waits for it when it tears the group down). In torch 2.x, dropping a reference
// to a tensor that has a Python object decrefs that object under the GIL
// (c10::intrusive_ptr's 2 -> 1 transition). On such a thread while the interpreter finalizes
// (a rank that returned from its program), CPython ends the thread with pthread_exit, whose
// unwinding stops at torch's noexcept decref: std::terminate, SIGABRT after a clean exit.
// detach() is a new TensorImpl on the same storage, so results still land in the caller's
// tensor, and no thread but the caller's ever touches its Python object.
std::vector<at::Tensor> WithoutPyObject(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> aliases;
  aliases.reserve(tensors.size());
  for (const at::Tensor& t : tensors) aliases.push_back(t.detach());
  return aliases;
}

py::dict PhasesDict(const Transition::Phases& p) {
  py::dict d;
  d["detect"] = absl::ToDoubleSeconds(p.detect);
  d["wait"] = absl::ToDoubleSeconds(p.wait);
  d["agree"] = absl::ToDoubleSeconds(p.agree);
  d["build"] = absl::ToDoubleSeconds(p.build);
  d["sync"] = absl::ToDoubleSeconds(p.sync);
  d["total"] = absl::ToDoubleSeconds(p.total);
  return d;
}

}  // namespace

void BindComm(py::module_& m) {
  py::class_<ControlStore, std::shared_ptr<ControlStore>>(
      m, "ControlStore", "The deployment's key-value store (a c10d TCPStore).")
      .def_static(
          "serve",
          [](const std::string& host, int port, double timeout_s) {
            const absl::Duration timeout = Seconds(timeout_s, "timeout");
            py::gil_scoped_release release;
            return ValueOrThrow(ControlStore::Host(host, port, timeout));
          },
          py::arg("host") = "127.0.0.1", py::arg("port") = 0, py::arg("timeout") = 30.0,
          "Starts a store server (port 0: an ephemeral port) and returns a client of it. "
          "The server lives as long as this handle.")
      .def_static(
          "connect",
          [](const std::string& host, int port, double timeout_s) {
            const absl::Duration timeout = Seconds(timeout_s, "timeout");
            py::gil_scoped_release release;
            return ValueOrThrow(ControlStore::Connect(host, port, timeout));
          },
          py::arg("host"), py::arg("port"), py::arg("timeout") = 30.0,
          "Connects to a running store server, retrying until the timeout.")
      .def_property_readonly("host", &ControlStore::host)
      .def_property_readonly("port", &ControlStore::port)
      .def(
          "set",
          [](ControlStore& s, const std::string& key, const py::bytes& value) {
            std::string v = value;
            py::gil_scoped_release release;
            ThrowIfError(s.Set(key, v));
          },
          py::arg("key"), py::arg("value"))
      .def(
          "try_get",
          [](ControlStore& s, const std::string& key) -> py::object {
            std::optional<std::string> v;
            {
              py::gil_scoped_release release;
              v = ValueOrThrow(s.TryGet(key));
            }
            if (!v.has_value()) return py::none();
            return py::bytes(*v);
          },
          py::arg("key"), "The value of `key` as bytes, or None (does not wait).")
      .def(
          "add",
          [](ControlStore& s, const std::string& key, int64_t delta) {
            py::gil_scoped_release release;
            return ValueOrThrow(s.Add(key, delta));
          },
          py::arg("key"), py::arg("delta"));

  py::class_<Transition>(m, "Transition", "What happened at a step boundary (or at join).")
      .def_property_readonly("kind",
                             [](const Transition& t) {
                               return std::string(TransitionKindName(t.kind));
                             })
      .def_readonly("generation", &Transition::generation)
      .def_readonly("rank", &Transition::rank)
      .def_readonly("size", &Transition::size)
      .def_readonly("members", &Transition::members)
      .def_readonly("joined", &Transition::joined)
      .def_readonly("removed", &Transition::removed)
      .def_readonly("resume_step", &Transition::resume_step)
      .def_readonly("state_source_rank", &Transition::state_source_rank)
      .def_readonly("committed_by_rank", &Transition::committed_by_rank)
      .def_readonly("reason", &Transition::reason)
      .def_property_readonly("phases", [](const Transition& t) { return PhasesDict(t.phases); })
      .def_property_readonly("changed", &Transition::changed)
      .def_property_readonly("active", &Transition::active)
      .def("__repr__", [](const Transition& t) {
        return absl::StrCat("Transition(kind=", TransitionKindName(t.kind),
                            ", generation=", t.generation, ", rank=", t.rank, ", size=", t.size,
                            ", resume_step=", t.resume_step, ")");
      });

  py::class_<PendingCollective>(m, "PendingCollective", "A collective in flight.")
      .def(
          "wait",
          [](PendingCollective& p) {
            py::gil_scoped_release release;
            ThrowIfError(p.Wait());
          },
          "Blocks until it completes; raises if the generation failed.")
      .def("done", &PendingCollective::done);

  py::class_<ElasticGroup>(m, "ElasticGroup",
                           "Membership of one job as a sequence of generations.")
      .def_static(
          "join",
          [](std::shared_ptr<ControlStore> store, const std::string& job_id,
             const std::string& member_id, int bootstrap_size, int max_size,
             double rendezvous_timeout, double op_timeout, double heartbeat_interval,
             double heartbeat_timeout, double recovery_grace, int max_recoveries_without_commit,
             const std::string& data_backend) {
            ElasticGroupOptions o;
            o.data_backend = ValueOrThrow(comm::MakeDataBackend(data_backend));
            o.job_id = job_id;
            o.member_id = member_id;
            o.bootstrap_size = bootstrap_size;
            o.max_size = max_size;
            o.rendezvous_timeout = Seconds(rendezvous_timeout, "rendezvous_timeout");
            o.op_timeout = Seconds(op_timeout, "op_timeout");
            o.heartbeat_interval = Seconds(heartbeat_interval, "heartbeat_interval");
            o.heartbeat_timeout = Seconds(heartbeat_timeout, "heartbeat_timeout");
            o.recovery_grace = Seconds(recovery_grace, "recovery_grace");
            o.max_recoveries_without_commit = max_recoveries_without_commit;
            py::gil_scoped_release release;
            return ValueOrThrow(ElasticGroup::Join(std::move(store), std::move(o)));
          },
          py::arg("store"), py::arg("job_id"), py::arg("member_id") = "",
          py::arg("bootstrap_size") = 0, py::arg("max_size") = 1024,
          py::arg("rendezvous_timeout") = 60.0, py::arg("op_timeout") = 60.0,
          py::arg("heartbeat_interval") = 0.1, py::arg("heartbeat_timeout") = 2.0,
          py::arg("recovery_grace") = 0.5, py::arg("max_recoveries_without_commit") = 16,
          py::arg("data_backend") = "gloo",
          "Registers in the job and blocks until this process is a member of a built "
          "generation. data_backend: 'gloo' (CPU tensors), 'gloo-cuda' (also CUDA tensors, "
          "through host memory) or 'nccl' (CUDA tensors; one GPU per rank).")
      .def_property_readonly("rank", &ElasticGroup::rank)
      .def_property_readonly("size", &ElasticGroup::size)
      .def_property_readonly("generation", &ElasticGroup::generation)
      .def_property_readonly("members", &ElasticGroup::members)
      .def_property_readonly("member_id", &ElasticGroup::member_id)
      .def_property_readonly("job_id", &ElasticGroup::job_id)
      .def_property_readonly("active", &ElasticGroup::active)
      .def_property_readonly("last_transition", &ElasticGroup::last_transition)
      .def_property_readonly("committed_step", &ElasticGroup::committed_step)
      .def("commit", &ElasticGroup::Commit, py::arg("step"),
           "Records that `step` completed on this rank.")
      .def(
          "at_step_boundary",
          [](ElasticGroup& g) {
            py::gil_scoped_release release;
            return ValueOrThrow(g.AtStepBoundary());
          },
          "The step boundary: returns the Transition (kind 'none' when nothing changed).")
      .def(
          "begin_step_boundary",
          [](ElasticGroup& g) {
            py::gil_scoped_release release;
            ThrowIfError(g.BeginStepBoundary());
          },
          "Starts the next boundary's vote without waiting for it (call it once the step's "
          "gradients are reduced; at_step_boundary() completes it).")
      .def(
          "request_leave", [](ElasticGroup& g) { ThrowIfError(g.RequestLeave()); },
          "Asks to leave at the next step boundary.")
      .def("finish", &ElasticGroup::Finish,
           "This member is done with the job together with the others: closing the group "
           "will not fail the generation.")
      .def(
          "allreduce",
          [](ElasticGroup& g, std::vector<at::Tensor> tensors, const std::string& op) {
            const ReduceOp parsed = ParseOp(op);
            comm::Communicator& c = CommOf(g);
            std::vector<at::Tensor> aliases = WithoutPyObject(tensors);
            py::gil_scoped_release release;
            ThrowIfError(c.AllReduce(aliases, parsed));
          },
          py::arg("tensors"), py::arg("op") = "sum",
          "In-place allreduce over the current generation.")
      .def(
          "allreduce_async",
          [](ElasticGroup& g, std::vector<at::Tensor> tensors, const std::string& op) {
            const ReduceOp parsed = ParseOp(op);
            comm::Communicator& c = CommOf(g);
            std::vector<at::Tensor> aliases = WithoutPyObject(tensors);
            py::gil_scoped_release release;
            return ValueOrThrow(c.AllReduceAsync(aliases, parsed));
          },
          py::arg("tensors"), py::arg("op") = "sum",
          "Starts an in-place allreduce and returns a PendingCollective.")
      .def(
          "broadcast",
          [](ElasticGroup& g, std::vector<at::Tensor> tensors, int root) {
            comm::Communicator& c = CommOf(g);
            if (root < 0 || root >= c.size()) {
              ThrowIfError(absl::InvalidArgumentError(
                  absl::StrCat("root: must be a rank in [0, ", c.size(), "), got ", root)));
            }
            std::vector<at::Tensor> aliases = WithoutPyObject(tensors);
            py::gil_scoped_release release;
            ThrowIfError(c.Broadcast(aliases, root));
          },
          py::arg("tensors"), py::arg("root"), "In-place broadcast from rank `root`.")
      .def(
          "send",
          [](ElasticGroup& g, at::Tensor tensor, int peer, int tag) {
            comm::Communicator& c = CommOf(g);
            at::Tensor alias = tensor.detach();  // see WithoutPyObject
            py::gil_scoped_release release;
            ThrowIfError(c.Send(std::move(alias), peer, tag));
          },
          py::arg("tensor"), py::arg("peer"), py::arg("tag"),
          "Sends `tensor` to rank `peer` (matched by `tag`); blocks until it is sent.")
      .def(
          "recv",
          [](ElasticGroup& g, at::Tensor tensor, int peer, int tag) {
            comm::Communicator& c = CommOf(g);
            at::Tensor alias = tensor.detach();  // see WithoutPyObject
            py::gil_scoped_release release;
            ThrowIfError(c.Recv(std::move(alias), peer, tag));
          },
          py::arg("tensor"), py::arg("peer"), py::arg("tag"),
          "Receives into `tensor` (its size must match) from rank `peer` (matched by `tag`).")
      .def(
          "barrier",
          [](ElasticGroup& g) {
            comm::Communicator& c = CommOf(g);
            py::gil_scoped_release release;
            ThrowIfError(c.Barrier());
          })
      .def_property_readonly("comm_failed",
                             [](ElasticGroup& g) { return g.active() && g.comm().aborted(); });

  m.def(
      "request_leave",
      [](std::shared_ptr<ControlStore> store, const std::string& job_id,
         const std::string& member_id) {
        py::gil_scoped_release release;
        ThrowIfError(ElasticGroup::RequestLeave(*store, job_id, member_id));
      },
      py::arg("store"), py::arg("job_id"), py::arg("member_id"),
      "Queues a leave of `member_id` at the job's next step boundary.");
  m.def(
      "report_dead",
      [](std::shared_ptr<ControlStore> store, const std::string& job_id,
         const std::string& member_id) {
        py::gil_scoped_release release;
        ThrowIfError(ElasticGroup::ReportDead(*store, job_id, member_id));
      },
      py::arg("store"), py::arg("job_id"), py::arg("member_id"),
      "Reports that the process of `member_id` exited, so recovery need not wait for it.");
  m.def(
      "latest_generation",
      [](std::shared_ptr<ControlStore> store, const std::string& job_id) -> py::object {
        absl::StatusOr<comm::GenerationRecord> r;
        {
          py::gil_scoped_release release;
          r = ElasticGroup::LatestGeneration(*store, job_id);
        }
        if (r.status().code() == absl::StatusCode::kNotFound) return py::none();
        comm::GenerationRecord rec = ValueOrThrow(std::move(r));
        py::dict d;
        d["generation"] = rec.generation;
        d["members"] = rec.members;
        d["nodes"] = rec.nodes;
        d["reason"] = rec.reason;
        return d;
      },
      py::arg("store"), py::arg("job_id"),
      "The newest generation of a job as {generation, members, nodes, reason}, or None "
      "(nodes: one per member, '' unknown; [] when no member said its node).");
}

}  // namespace malle::python
