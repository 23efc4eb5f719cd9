// Binds libmalle/cluster: the rank environment contract (rank_env.h), so that
// Python launchers and ranks read and write the same variables as C++ ones,
// and LocalProcess (local_process.h), the one way rank processes are started.
// Blocking calls (wait, kill, spawn's fork) release the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <string>
#include <utility>

#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "libmalle/cluster/local_process.h"
#include "libmalle/cluster/node_slots.h"
#include "libmalle/cluster/rank_env.h"
#include "libmalle/cluster/zygote.h"
#include "python/src/bind_common.h"

namespace py = pybind11;

namespace malle::python {

void BindCluster(py::module_& m) {
  using cluster::RankEnv;
  py::class_<RankEnv>(m, "RankEnv")
      .def(py::init<>())
      .def_readwrite("store", &RankEnv::store)
      .def_readwrite("job_id", &RankEnv::job_id)
      .def_readwrite("member_id", &RankEnv::member_id)
      .def_readwrite("bootstrap_size", &RankEnv::bootstrap_size)
      .def_readwrite("control_job", &RankEnv::control_job)
      .def_readwrite("control_secret", &RankEnv::control_secret)
      .def_readwrite("node", &RankEnv::node)
      .def_readwrite("min_nodes", &RankEnv::min_nodes)
      .def_readwrite("max_nodes", &RankEnv::max_nodes)
      .def_readwrite("backend", &RankEnv::backend)
      .def_readwrite("park_dir", &RankEnv::park_dir)
      .def_readwrite("local_rank", &RankEnv::local_rank)
      .def_readwrite("local_world_size", &RankEnv::local_world_size)
      .def_property_readonly("store_host", &RankEnv::store_host)
      .def_property_readonly("store_port", &RankEnv::store_port)
      .def("validate", [](const RankEnv& e) { ThrowIfError(e.Validate()); })
      .def("vars", [](const RankEnv& e) {
        std::map<std::string, std::string> out;
        for (auto& [k, v] : cluster::RankEnvVars(e)) out[k] = v;
        return out;
      });
  // From a mapping (os.environ or a dict): the same rules as the C++ side.
  m.def("read_rank_env", [](const std::map<std::string, std::string>& environ) {
    return ValueOrThrow(cluster::ReadRankEnv([&](const char* name) -> std::optional<std::string> {
      auto it = environ.find(name);
      if (it == environ.end() || it->second.empty()) return std::nullopt;
      return it->second;
    }));
  });
  m.def("rank_env_names", &cluster::RankEnvNames);
  // The launchers users already have (torchrun, srun) translated into the contract.
  using cluster::LaunchEnv;
  py::class_<LaunchEnv>(m, "LaunchEnv")
      .def_property_readonly("launcher", [](const LaunchEnv& e) { return cluster::LauncherName(e.launcher); })
      .def_readonly("rank", &LaunchEnv::rank)
      .def_readonly("global_rank", &LaunchEnv::global_rank)
      .def_readonly("world_size", &LaunchEnv::world_size)
      .def_readonly("local_rank", &LaunchEnv::local_rank)
      .def_readonly("host_store", &LaunchEnv::host_store)
      .def_readonly("store_bind", &LaunchEnv::store_bind)
      .def_readonly("store_from", &LaunchEnv::store_from);
  m.def("read_launch_env", [](const std::map<std::string, std::string>& environ) {
    return ValueOrThrow(cluster::ReadLaunchEnv([&](const char* name) -> std::optional<std::string> {
      auto it = environ.find(name);
      if (it == environ.end() || it->second.empty()) return std::nullopt;
      return it->second;
    }));
  });
  m.def(
      "rank_cuda_device",
      [](const RankEnv& env, int visible_devices) {
        return ValueOrThrow(cluster::RankCudaDevice(env, visible_devices));
      },
      py::arg("env"), py::arg("visible_devices"));
  // The names themselves, so that no Python starter spells them.
  for (auto [attr, name] : {std::pair{"ENV_STORE", cluster::kEnvStore},
                            std::pair{"ENV_JOB_ID", cluster::kEnvJobId},
                            std::pair{"ENV_MEMBER_ID", cluster::kEnvMemberId},
                            std::pair{"ENV_BOOTSTRAP_SIZE", cluster::kEnvBootstrapSize},
                            std::pair{"ENV_CONTROL_JOB", cluster::kEnvControlJob},
                            std::pair{"ENV_CONTROL_SECRET", cluster::kEnvControlSecret},
                            std::pair{"ENV_NODE", cluster::kEnvNode},
                            std::pair{"ENV_MIN_NODES", cluster::kEnvMinNodes},
                            std::pair{"ENV_MAX_NODES", cluster::kEnvMaxNodes},
                            std::pair{"ENV_BACKEND", cluster::kEnvBackend},
                            std::pair{"ENV_LOCAL_RANK", cluster::kEnvLocalRank},
                            std::pair{"ENV_LOCAL_WORLD_SIZE", cluster::kEnvLocalWorldSize},
                            std::pair{"ENV_SECRET", cluster::kEnvSecret},
                            std::pair{"ENV_LOG_LEVEL", cluster::kEnvLogLevel},
                            std::pair{"ENV_BIN_DIR", cluster::kEnvBinDir}}) {
    m.attr(attr) = name;
  }
  m.def("generated_member_id", &cluster::GeneratedMemberId);

  using cluster::Zygote;
  py::class_<Zygote, std::shared_ptr<Zygote>>(
      m, "Zygote", "A warm interpreter that forks Python processes (libmalle/cluster/zygote.h).")
      .def_static(
          "start",
          [](const std::string& python, const std::vector<std::string>& preload,
             const std::map<std::string, std::string>& env, const std::string& log,
             const std::vector<std::string>& import_time_env) {
            cluster::ZygoteOptions o;
            o.python = python;
            o.preload = preload;
            o.env.assign(env.begin(), env.end());
            o.log_path = log;
            o.import_time_env = import_time_env;
            py::gil_scoped_release release;
            return ValueOrThrow(Zygote::Start(std::move(o)));
          },
          py::arg("python"), py::kw_only(),
          py::arg("preload") = std::vector<std::string>{"torch", "torch._dynamo", "malletrain"},
          py::arg("env") = std::map<std::string, std::string>{}, py::arg("log") = "",
          py::arg("import_time_env") = std::vector<std::string>{},
          "Starts the zygote; does not wait for its imports (wait_ready).")
      .def_property_readonly("pid", &Zygote::pid)
      .def_property_readonly("python", &Zygote::python)
      .def_property_readonly("ready", [](Zygote& z) { return z.Ready(); })
      .def_property_readonly("failure", [](Zygote& z) { return z.failure(); },
                             "Why it is unusable ('' while importing or ready).")
      .def_property_readonly("warmup_s", &Zygote::warmup_seconds)
      .def(
          "wait_ready",
          [](Zygote& z, double timeout_s) {
            if (!(timeout_s >= 0)) {
              throw StatusError(absl::InvalidArgumentError("timeout: must be >= 0 seconds"));
            }
            py::gil_scoped_release release;
            ThrowIfError(z.WaitReady(absl::Seconds(timeout_s)));
          },
          py::arg("timeout"), "Blocks until ready; MalleTimeoutError, or MalleError if it failed.");
  m.def("import_time_variable", &cluster::ImportTimeVariable, py::arg("name"),
        "Whether a warm process must have the zygote's value of this variable.");

  using cluster::LocalProcess;
  // Exit codes follow subprocess.Popen: the code, or -signal.
  py::class_<LocalProcess>(m, "LocalProcess", "A child process owned by this object (PDEATHSIG).")
      .def_static(
          "spawn",
          [](const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
             bool clear_env, std::optional<RankEnv> rank_env, const std::string& stdout_path,
             const std::string& stderr_path, bool stderr_to_stdout, bool truncate_logs,
             const std::string& cwd, bool new_process_group, std::shared_ptr<Zygote> zygote) {
            cluster::ProcessSpec spec;
            spec.zygote = std::move(zygote);
            spec.argv = argv;
            spec.env.assign(env.begin(), env.end());
            spec.clear_env = clear_env;
            spec.rank_env = std::move(rank_env);
            spec.stdout_path = stdout_path;
            spec.stderr_path = stderr_path;
            spec.stderr_to_stdout = stderr_to_stdout;
            spec.truncate_logs = truncate_logs;
            spec.cwd = cwd;
            spec.new_process_group = new_process_group;
            py::gil_scoped_release release;
            return ValueOrThrow(LocalProcess::Spawn(spec));
          },
          py::arg("argv"), py::kw_only(), py::arg("env") = std::map<std::string, std::string>{},
          py::arg("clear_env") = false, py::arg("rank_env") = std::nullopt, py::arg("stdout") = "",
          py::arg("stderr") = "", py::arg("stderr_to_stdout") = false, py::arg("truncate") = false,
          py::arg("cwd") = "", py::arg("new_process_group") = false,
          py::arg("zygote") = std::shared_ptr<Zygote>())
      .def_property_readonly("pid", &LocalProcess::pid)
      .def_property_readonly("warm", &LocalProcess::warm, "Forked from the zygote given to spawn.")
      .def_property_readonly("cold_reason", &LocalProcess::cold_reason,
                             "Why the zygote given to spawn did not start it ('' if it did or none was given).")
      .def_property_readonly("leads_group", &LocalProcess::leads_group)
      .def(
          "poll",
          [](LocalProcess& p) -> std::optional<int> {
            auto e = p.PollStatus();
            if (!e) return std::nullopt;
            return e->PythonCode();
          },
          "The exit code (-signal if killed), or None while it runs. Does not block.")
      .def(
          "wait",
          [](LocalProcess& p, double timeout_s) {
            if (!(timeout_s >= 0)) {
              throw StatusError(absl::InvalidArgumentError("timeout: must be >= 0 seconds"));
            }
            py::gil_scoped_release release;
            return ValueOrThrow(p.WaitStatus(absl::Seconds(timeout_s))).PythonCode();
          },
          py::arg("timeout"), "Waits for the exit; MalleTimeoutError after `timeout` seconds.")
      .def(
          "signal", [](LocalProcess& p, int sig) { ThrowIfError(p.Signal(sig)); }, py::arg("signal"),
          "Sends `signal` (to its group if it leads one); MalleError once it has exited.")
      .def(
          "kill",
          [](LocalProcess& p, double timeout_s) {
            py::gil_scoped_release release;
            (void)p.Kill(absl::Seconds(timeout_s));
            auto e = p.PollStatus();
            if (!e) throw StatusError(absl::DeadlineExceededError("the process did not die"));
            return e->PythonCode();
          },
          py::arg("timeout") = 10.0, "SIGKILL (its group too), then waits; returns the exit code.");
}

}  // namespace malle::python
