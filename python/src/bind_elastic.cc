// Binds libmalle/elastic for the Python training API (malletrain.elastic): the
// engine (engine.h), its plans and resize events, the sampler, the seeds.
//
// The engine calls back into Python for the parts of the job state only
// Python understands (a torch.optim state_dict, tracked objects). Those
// callbacks run on the training thread with the GIL re-acquired; a Python
// exception inside one is kept, the engine sees an INVALID_ARGUMENT status
// (fatal, never retried), and the binding re-raises the original exception
// when the engine call returns. Every call that can block releases the GIL.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "libmalle/comm/control_store.h"
#include "libmalle/comm/elastic_group.h"
#include "libmalle/elastic/engine.h"
#include "libmalle/elastic/launch_session.h"
#include "libmalle/elastic/rank_engine.h"
#include "libmalle/elastic/sampler.h"
#include "python/src/bind_common.h"

namespace py = pybind11;

namespace malle::python {
namespace {

using elastic::Engine;
using elastic::NamedTensor;
using elastic::PartState;

absl::Duration Seconds(double s, const char* field) {
  if (!(s > 0) || s > 1e9) {
    ThrowIfError(absl::InvalidArgumentError(absl::StrCat(field, ": must be a positive number of seconds, got ", s)));
  }
  return absl::Seconds(s);
}

// An engine with the Python exception its callbacks raised, if any.
struct PyEngine {
  std::unique_ptr<Engine> engine;
  std::optional<py::error_already_set> error;  // set with the GIL held

  // Runs `f` without the GIL; re-raises a callback's exception, else throws
  // the status as usual. Returns nothing for an absl::Status (an error was
  // thrown), the value for an absl::StatusOr.
  template <typename F, typename R = decltype(std::declval<F>()())>
  auto Call(F&& f) -> std::conditional_t<std::is_same_v<R, absl::Status>, void, R> {
    auto finish = [this](const absl::Status& s) {
      if (error) {
        py::error_already_set e = std::move(*error);
        error.reset();
        throw e;
      }
      if (!s.ok() && engine->excluded()) {
        // Declared failed by the others: the group moved on without it.
        absl::Status moved = absl::FailedPreconditionError(s.message());
        moved.SetPayload(kErrorClassPayloadUrl, absl::Cord("MembershipChangedError"));
        throw StatusError(moved);
      }
      ThrowIfError(s);
    };
    if constexpr (std::is_same_v<R, absl::Status>) {
      absl::Status s;
      {
        py::gil_scoped_release release;
        s = f();
      }
      finish(s);
    } else {
      R r = [&] {
        py::gil_scoped_release release;
        return f();
      }();
      finish(r.status());
      return r;
    }
  }

  // A Python callable as a part's save/load: any exception is kept and
  // becomes an INVALID_ARGUMENT naming the part.
  std::function<absl::StatusOr<PartState>()> Save(std::string name, py::function fn) {
    return [this, name, fn]() -> absl::StatusOr<PartState> {
      py::gil_scoped_acquire gil;
      try {
        auto [tensors, bytes] = fn().cast<std::pair<std::vector<at::Tensor>, py::bytes>>();
        return PartState{std::move(tensors), std::string(bytes)};
      } catch (py::error_already_set& e) {
        std::string what = e.what();
        if (!error) error.emplace(std::move(e));
        return absl::InvalidArgumentError(absl::StrCat("state of '", name, "': ", what));
      }
    };
  }
  std::function<absl::Status(PartState)> Load(std::string name, py::function fn) {
    return [this, name, fn](PartState s) -> absl::Status {
      py::gil_scoped_acquire gil;
      try {
        fn(std::move(s.tensors), py::bytes(s.bytes));
        return absl::OkStatus();
      } catch (py::error_already_set& e) {
        std::string what = e.what();
        if (!error) error.emplace(std::move(e));
        return absl::InvalidArgumentError(absl::StrCat("state of '", name, "': ", what));
      }
    };
  }
};

py::dict PhasesDict(const elastic::ResizeEvent::Phases& p) {
  py::dict d;
  d["detect"] = absl::ToDoubleSeconds(p.detect);
  d["wait"] = absl::ToDoubleSeconds(p.wait);
  d["agree"] = absl::ToDoubleSeconds(p.agree);
  d["build"] = absl::ToDoubleSeconds(p.build);
  d["sync"] = absl::ToDoubleSeconds(p.sync);
  d["state"] = absl::ToDoubleSeconds(p.state);
  d["total"] = absl::ToDoubleSeconds(p.total);
  return d;
}

std::vector<NamedTensor> Named(const std::vector<std::pair<std::string, at::Tensor>>& items) {
  std::vector<NamedTensor> out;
  for (const auto& [name, t] : items) out.push_back({name, t});
  return out;
}

}  // namespace

void BindElastic(py::module_& m) {
  py::class_<elastic::WorkerPlan>(m, "WorkerPlan")
      .def_readonly("worker", &elastic::WorkerPlan::worker)
      .def_readonly("rng_seed", &elastic::WorkerPlan::rng_seed)
      .def_readonly("data_seed", &elastic::WorkerPlan::data_seed)
      .def_readonly("indices", &elastic::WorkerPlan::indices);
  py::class_<elastic::StepPlan>(m, "StepPlan", "This rank's share of one step.")
      .def_readonly("step", &elastic::StepPlan::step)
      .def_readonly("generation", &elastic::StepPlan::generation)
      .def_readonly("rank", &elastic::StepPlan::rank)
      .def_readonly("size", &elastic::StepPlan::size)
      .def_readonly("workers", &elastic::StepPlan::workers)
      .def_readonly("lr_rescale", &elastic::StepPlan::lr_rescale);
  py::class_<elastic::BatchKeys>(m, "BatchKeys",
                                 "This rank's micro-batches from a plan's step on (engine.h BatchKeys): "
                                 "iterates (data seed, indices); follows(plan, position).")
      .def("__iter__", [](elastic::BatchKeys& k) -> elastic::BatchKeys& { return k; })
      .def("__next__",
           [](elastic::BatchKeys& k) {
             std::optional<elastic::WorkerPlan> w = k.Next();
             if (!w) throw py::stop_iteration();
             return std::make_pair(w->data_seed, std::move(w->indices));
           })
      .def("follows", &elastic::BatchKeys::Follows, py::arg("plan"), py::arg("position"));
  py::class_<elastic::ResizeEvent>(m, "ResizeEvent", "One membership change as this rank saw it.")
      .def_property_readonly("kind", [](const elastic::ResizeEvent& e) {
        return std::string(comm::TransitionKindName(e.kind));
      })
      .def_readonly("generation", &elastic::ResizeEvent::generation)
      .def_readonly("size", &elastic::ResizeEvent::size)
      .def_readonly("rank", &elastic::ResizeEvent::rank)
      .def_readonly("resume_step", &elastic::ResizeEvent::resume_step)
      .def_readonly("joined", &elastic::ResizeEvent::joined)
      .def_readonly("removed", &elastic::ResizeEvent::removed)
      .def_readonly("state_bytes", &elastic::ResizeEvent::state_bytes)
      .def_readonly("state_in_place", &elastic::ResizeEvent::state_in_place)
      .def_readonly("state_landed", &elastic::ResizeEvent::state_landed)
      .def_readonly("state_received_remote", &elastic::ResizeEvent::state_received_remote)
      .def_readonly("state_sent_remote", &elastic::ResizeEvent::state_sent_remote)
      .def_readonly("state_sent_local", &elastic::ResizeEvent::state_sent_local)
      .def_readonly("reason", &elastic::ResizeEvent::reason)
      .def_property_readonly("phases", [](const elastic::ResizeEvent& e) { return PhasesDict(e.phases); })
      .def("__repr__", [](const elastic::ResizeEvent& e) {
        return absl::StrCat("ResizeEvent(kind=", comm::TransitionKindName(e.kind), ", generation=", e.generation,
                            ", size=", e.size, ", rank=", e.rank, ", resume_step=", e.resume_step, ")");
      });

  py::class_<PyEngine>(m, "Engine", "The elastic training engine (libmalle/elastic/engine.h).")
      .def(py::init([](const cluster::RankEnv& env, double rendezvous_timeout, double op_timeout,
                       double heartbeat_interval, double heartbeat_timeout, double recovery_grace,
                       int max_recoveries_without_commit, const std::string& backend, int logical_workers,
                       const std::string& lr_scaling, uint64_t seed, bool deterministic, int64_t bucket_bytes,
                       int snapshot_every, const std::string& resume_from) {
             elastic::RankEngineOptions o;
             o.group.rendezvous_timeout = Seconds(rendezvous_timeout, "rendezvous_timeout");
             o.group.op_timeout = Seconds(op_timeout, "op_timeout");
             o.group.heartbeat_interval = Seconds(heartbeat_interval, "heartbeat_interval");
             o.group.heartbeat_timeout = Seconds(heartbeat_timeout, "heartbeat_timeout");
             o.group.recovery_grace = Seconds(recovery_grace, "recovery_grace");
             o.group.max_recoveries_without_commit = max_recoveries_without_commit;
             o.engine.backend = backend;
             o.engine.logical_workers = logical_workers;
             o.engine.lr_scaling = lr_scaling;
             o.engine.seed = seed;
             o.engine.deterministic = deterministic;
             o.engine.bucket_bytes = bucket_bytes;
             o.engine.snapshot_every = snapshot_every;
             o.engine.resume_from = resume_from;
             auto e = std::make_unique<PyEngine>();
             py::gil_scoped_release release;  // dials the store
             e->engine = ValueOrThrow(elastic::CreateRankEngine(env, std::move(o)));
             return e;
           }),
           py::arg("env"), py::arg("rendezvous_timeout"), py::arg("op_timeout"), py::arg("heartbeat_interval"),
           py::arg("heartbeat_timeout"), py::arg("recovery_grace"), py::arg("max_recoveries_without_commit"),
           py::arg("backend"), py::arg("logical_workers"), py::arg("lr_scaling"), py::arg("seed"),
           py::arg("deterministic"), py::arg("bucket_bytes"), py::arg("snapshot_every") = 0,
           py::arg("resume_from") = "",
           "The engine of this rank, set up from its environment `env` (a RankEnv; "
           "libmalle/elastic/rank_engine.h); backend '': the environment's, else gloo.")
      .def(
          "set_model",
          [](PyEngine& e, const std::vector<std::pair<std::string, at::Tensor>>& params,
             const std::vector<std::pair<std::string, at::Tensor>>& buffers) {
            e.Call([&] { return e.engine->SetModel(Named(params), Named(buffers)); });
          },
          py::arg("parameters"), py::arg("buffers"))
      .def(
          "add_part",
          [](PyEngine& e, const std::string& name, py::function save, py::function load,
             std::optional<py::function> checkpoint, std::optional<py::function> restore) {
            elastic::PartSpec p;
            p.name = name;
            p.save = e.Save(name, std::move(save));
            p.load = e.Load(name, std::move(load));
            if (checkpoint) p.checkpoint = e.Save(name, std::move(*checkpoint));
            if (restore) p.restore = e.Load(name, std::move(*restore));
            e.Call([&] { return e.engine->AddPart(std::move(p)); });
          },
          py::arg("name"), py::arg("save"), py::arg("load"), py::arg("checkpoint") = py::none(),
          py::arg("restore") = py::none(),
          "A part of the job state: save() -> (tensors, bytes), load(tensors, bytes); "
          "checkpoint/restore: what a step that does not commit must undo (same forms).")
      .def(
          "set_data",
          [](PyEngine& e, int64_t num_samples, int64_t batch_size, std::optional<int64_t> steps,
             std::optional<double> epochs, bool shuffle, bool drop_last) {
            elastic::DataOptions d;
            d.num_samples = num_samples;
            d.batch_size = batch_size;
            d.steps = steps;
            d.epochs = epochs;
            d.shuffle = shuffle;
            d.drop_last = drop_last;
            ThrowIfError(e.engine->SetData(d));
          },
          py::arg("num_samples"), py::arg("batch_size"), py::arg("steps"), py::arg("epochs"), py::arg("shuffle"),
          py::arg("drop_last") = true)
      .def("prepare_landing", [](PyEngine& e) {
        e.Call([&] {
          e.engine->PrepareLanding();
          return absl::OkStatus();
        });
      })
      .def("join", [](PyEngine& e) { e.Call([&] { return e.engine->Join(); }); })
      .def("next_step", [](PyEngine& e) { return e.Call([&] { return e.engine->NextStep(); }).value(); })
      .def("begin_micro_batch", [](PyEngine& e, size_t i) {
        if (!e.engine->in_step() || i != static_cast<size_t>(e.engine->micro_batch() + 1) ||
            i >= e.engine->workers().size()) {
          ThrowIfError(absl::FailedPreconditionError("begin_micro_batch: out of order"));
        }
        e.engine->BeginMicroBatch(i);
      })
      .def("end_micro_batch", [](PyEngine& e) { e.Call([&] { return e.engine->EndMicroBatch(); }); })
      .def("add_data_wait", [](PyEngine& e, double s) { e.engine->AddDataWait(absl::Seconds(s)); })
      .def("synchronize", [](PyEngine& e) { return e.Call([&] { return e.engine->Synchronize(); }).value(); })
      .def("commit", [](PyEngine& e) { e.Call([&] { return e.engine->Commit(); }); })
      .def("request_leave", [](PyEngine& e) { ThrowIfError(e.engine->RequestLeave()); })
      .def("finish", [](PyEngine& e) {
        e.Call([&] {
          e.engine->Finish();
          return absl::OkStatus();
        });
      })
      .def("close", [](PyEngine& e) {
        py::gil_scoped_release release;
        e.engine->Close();
      })
      .def("state_digest", [](PyEngine& e) { return e.Call([&] { return e.engine->StateDigest(); }).value(); })
      .def(
          "save", [](PyEngine& e, const std::string& path) { e.Call([&] { return e.engine->Save(path); }); },
          py::arg("path"))
      .def_property_readonly("parked", [](PyEngine& e) { return e.engine->parked(); })
      .def_property_readonly("resumed_from", [](PyEngine& e) { return e.engine->resumed_from(); })
      .def_property_readonly("snapshot_step", [](PyEngine& e) { return e.engine->snapshot_step(); })
      .def_property_readonly("snapshot_interval", [](PyEngine& e) { return e.engine->snapshot_interval(); })
      .def_property_readonly("snapshot_copy_seconds", [](PyEngine& e) {
        return absl::ToDoubleSeconds(e.engine->snapshot_copy_time());
      })
      .def_property_readonly("snapshot_write_seconds", [](PyEngine& e) {
        return absl::ToDoubleSeconds(e.engine->snapshot_write_time());
      })
      .def_property_readonly("snapshot_write_cpu_seconds", [](PyEngine& e) {
        return absl::ToDoubleSeconds(e.engine->snapshot_write_cpu_time());
      })
      .def("report_json", [](PyEngine& e) {
        py::gil_scoped_release release;
        return e.engine->ReportJson();
      })
      .def("report_table", [](PyEngine& e) {
        py::gil_scoped_release release;
        return e.engine->ReportTable();
      })
      .def(
          "keys_from",
          [](PyEngine& e, const elastic::StepPlan& plan) {
            return ValueOrThrow(e.engine->KeysFrom(plan));
          },
          py::arg("plan"), "This rank's micro-batches from `plan` on (a BatchKeys iterator).")
      .def(
          "data_seed", [](PyEngine& e, int64_t step, int worker) { return e.engine->DataSeed(step, worker); },
          py::arg("step"), py::arg("worker"), "A logical worker's data seed at `step`.")
      .def_property_readonly("rank", [](PyEngine& e) { return e.engine->rank(); })
      .def_property_readonly("size", [](PyEngine& e) { return e.engine->size(); })
      .def_property_readonly("generation", [](PyEngine& e) { return e.engine->generation(); })
      .def_property_readonly("member_id", [](PyEngine& e) { return e.engine->member_id(); })
      .def_property_readonly("step", [](PyEngine& e) { return e.engine->step(); })
      .def_property_readonly("total_steps", [](PyEngine& e) { return e.engine->total_steps(); })
      .def_property_readonly("micro_batch", [](PyEngine& e) { return e.engine->micro_batch(); })
      .def_property_readonly("in_step", [](PyEngine& e) { return e.engine->in_step(); })
      .def_property_readonly("left", [](PyEngine& e) { return e.engine->left(); })
      .def_property_readonly("redone_steps", [](PyEngine& e) { return e.engine->redone_steps(); })
      .def_property_readonly("workers", [](PyEngine& e) { return e.engine->workers(); })
      .def_property_readonly("position", [](PyEngine& e) { return e.engine->position(); })
      .def_property_readonly("landing_bytes", [](PyEngine& e) { return e.engine->landing_bytes(); })
      .def("set_advisor_enabled", [](PyEngine& e, bool on) { e.engine->SetAdvisorEnabled(on); }, py::arg("on"))
      .def_property_readonly("advisor_seconds",
                             [](PyEngine& e) { return absl::ToDoubleSeconds(e.engine->advisor_time()); })
      .def_property_readonly("history_size", [](PyEngine& e) { return e.engine->history().size(); })
      .def("history", [](PyEngine& e, size_t i) { return e.engine->history().at(i); })
      .def_property_readonly(
          "group", [](PyEngine& e) { return e.engine->group(); }, py::return_value_policy::reference_internal,
          "The ElasticGroup once joined (collectives of the current generation, for tools and "
          "benchmarks), else None.");

  // The sampler and the seeds (the Python names of sampler.h).
  py::class_<elastic::ElasticSampler>(m, "ElasticSampler")
      .def(py::init([](int64_t num_samples, int logical_workers, int64_t batch_size, uint64_t seed, bool shuffle) {
             elastic::SamplerOptions o;
             o.num_samples = num_samples;
             o.logical_workers = logical_workers;
             o.batch_size = batch_size;
             o.seed = seed;
             o.shuffle = shuffle;
             return ValueOrThrow(elastic::ElasticSampler::Create(o));
           }),
           py::arg("num_samples"), py::arg("logical_workers"), py::arg("batch_size"), py::arg("seed"),
           py::arg("shuffle"))
      .def_property_readonly("num_samples", &elastic::ElasticSampler::num_samples)
      .def_property_readonly("logical_workers", &elastic::ElasticSampler::logical_workers)
      .def_property_readonly("batch_size", &elastic::ElasticSampler::batch_size)
      .def_property_readonly("global_batch", &elastic::ElasticSampler::global_batch)
      .def("steps_for_epochs", &elastic::ElasticSampler::StepsForEpochs, py::arg("epochs"), py::arg("drop_last") = true)
      .def("epoch_of", &elastic::ElasticSampler::EpochOf, py::arg("step"))
      .def(
          "indices",
          [](elastic::ElasticSampler& s, int64_t step, int worker) {
            if (step < 0 || worker < 0 || worker >= s.logical_workers()) {
              ThrowIfError(absl::InvalidArgumentError(absl::StrCat("indices: need step >= 0 and 0 <= worker < ",
                                                                   s.logical_workers(), ", got step ", step,
                                                                   ", worker ", worker)));
            }
            return s.Indices(step, worker);
          },
          py::arg("step"), py::arg("worker"))
      .def(
          "stream",
          [](elastic::ElasticSampler& s, int64_t position, int64_t count) {
            if (position < 0 || count < 0) {
              ThrowIfError(absl::InvalidArgumentError(
                  absl::StrCat("stream: need position >= 0 and count >= 0, got ", position, ", ", count)));
            }
            return s.Stream(position, count);
          },
          py::arg("position"), py::arg("count"))
      .def(
          "sample_epochs",
          [](const elastic::ElasticSampler& s, int64_t step, int worker) {
            if (step < 0 || worker < 0 || worker >= s.logical_workers()) {
              ThrowIfError(absl::InvalidArgumentError("sample_epochs: step or worker out of range"));
            }
            return s.SampleEpochs(step, worker);
          },
          py::arg("step"), py::arg("worker"));
  m.def(
      "mix_seed", [](const std::vector<int64_t>& parts) { return elastic::MixSeed(parts); }, py::arg("parts"),
      "A 63-bit seed from 64-bit integers (splitmix64 fold).");
  m.def(
      "assign_workers",
      [](int logical_workers, int world_size, int rank) {
        if (world_size > logical_workers) {
          ThrowIfError(absl::InvalidArgumentError(absl::StrCat("assign_workers: world_size ", world_size,
                                                               " exceeds logical_workers ", logical_workers)));
        }
        if (world_size < 1 || rank < 0 || rank >= world_size) {
          ThrowIfError(absl::InvalidArgumentError(absl::StrCat(
              "assign_workers: need world_size >= 1 and 0 <= rank < world_size, got ", world_size, ", ", rank)));
        }
        return elastic::AssignWorkers(logical_workers, world_size, rank);
      },
      py::arg("logical_workers"), py::arg("world_size"), py::arg("rank"));
  py::class_<elastic::LaunchSession>(m, "LaunchSession",
                                     "What a torchrun/srun rank does around its engine: task 0 hosts the "
                                     "control store; at the end members count themselves closed "
                                     "(libmalle/elastic/launch_session.h).")
      .def_static(
          "open",
          [](const cluster::LaunchEnv& launch, double timeout_s) {
            return ValueOrThrow(elastic::LaunchSession::Open(launch, Seconds(timeout_s, "timeout")));
          },
          py::arg("launch"), py::arg("timeout"))
      .def_property_readonly("hosting", &elastic::LaunchSession::hosting)
      .def(
          "close",
          [](elastic::LaunchSession& s, int size, double timeout_s) {
            const absl::Duration timeout = Seconds(timeout_s, "timeout");
            absl::Status st;
            {
              py::gil_scoped_release release;
              st = s.Close(size, timeout);
            }
            ThrowIfError(st);
          },
          py::arg("size"), py::arg("timeout"),
          "Counts this member closed; the host waits for `size` members (blocks).");
  m.def(
      "progress_key", [](const std::string& job_id) { return elastic::ProgressKey(job_id); }, py::arg("job_id"));
  m.def(
      "state_layout_key", [](const std::string& job_id) { return elastic::StateLayoutKey(job_id); },
      py::arg("job_id"));
  m.def(
      "flatten_tensors", [](const std::vector<at::Tensor>& tensors) { return elastic::FlattenTensors(tensors); },
      py::arg("tensors"),
      "Makes `tensors` views of one new 64-byte-aligned buffer per dtype (values and tensor objects kept).");
}

}  // namespace malle::python
