// The Python binding of WorkerTelemetry (python/worker_telemetry.h), added
// to the _pstrain module by module.cc.
#ifndef PST_PYTHON_TELEMETRY_BINDING_H_
#define PST_PYTHON_TELEMETRY_BINDING_H_

#include <pybind11/pybind11.h>

namespace pst {

void BindWorkerTelemetry(pybind11::module_& m);

}  // namespace pst

#endif  // PST_PYTHON_TELEMETRY_BINDING_H_
