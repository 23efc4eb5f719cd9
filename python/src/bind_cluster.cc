// Binds libmalle/cluster: the rank environment contract (rank_env.h), so that
// Python launchers and ranks read and write the same variables as C++ ones.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <string>
#include <utility>

#include "libmalle/cluster/rank_env.h"
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
                            std::pair{"ENV_SECRET", cluster::kEnvSecret},
                            std::pair{"ENV_LOG_LEVEL", cluster::kEnvLogLevel},
                            std::pair{"ENV_BIN_DIR", cluster::kEnvBinDir}}) {
    m.attr(attr) = name;
  }
  m.def("generated_member_id", &cluster::GeneratedMemberId);
}

}  // namespace malle::python
