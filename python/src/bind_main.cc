// The malletrain._C module: one Bind<Module>() call per libmalle module.
#include <pybind11/pybind11.h>

#include "python/src/bind_common.h"
#ifdef MALLE_WITH_NCCL
#include "libmalle/comm/nccl_backend.h"
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "Private C++ extension of malletrain; use the malletrain package instead.";
#ifdef MALLE_WITH_NCCL
  malle::comm::RegisterNcclBackend();  // backend='nccl' for CUDA models
#endif
  malle::python::BindBase(m);
  malle::python::BindAlloc(m);
  malle::python::BindSim(m);
  malle::python::BindComm(m);
  malle::python::BindElastic(m);
  malle::python::BindAdvisor(m);
  malle::python::BindControl(m);
  malle::python::BindCluster(m);
}
