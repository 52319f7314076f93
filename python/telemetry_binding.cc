#include "python/telemetry_binding.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "python/worker_telemetry.h"

namespace py = pybind11;

namespace pst {
namespace {

// `status` raised as the pstrain.Error of its code (python/pstrain/errors.py).
[[noreturn]] void Raise(const absl::Status& status) {
  py::object error = py::module_::import("pstrain.errors")
                         .attr("from_status")(absl::StatusCodeToString(status.code()),
                                              std::string(status.message()), false);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

}  // namespace

void BindWorkerTelemetry(py::module_& m) {
  py::class_<WorkerTelemetry>(m, "WorkerTelemetry")
      .def_static(
          "start",
          [](int worker, std::optional<int> metrics_port, const std::string& metrics_address,
             const std::string& logdir, bool cluster_tls) {
            absl::StatusOr<std::unique_ptr<WorkerTelemetry>> telemetry = WorkerTelemetry::Start(
                {worker, metrics_port, metrics_address, logdir, cluster_tls});
            if (!telemetry.ok()) Raise(telemetry.status());
            return *std::move(telemetry);
          },
          py::arg("worker"), py::arg("metrics_port"), py::arg("metrics_address"),
          py::arg("logdir"), py::arg("cluster_tls"))
      .def_property_readonly("metrics_port", &WorkerTelemetry::metrics_port)
      .def_property_readonly("events_path", &WorkerTelemetry::events_path)
      .def("record_window",
           [](WorkerTelemetry& t, int64_t step, double loss, int64_t samples, double staleness,
              int64_t version, const std::vector<std::string>& names,
              const std::vector<py::array_t<float, py::array::c_style | py::array::forcecast>>&
                  gradients) {
             if (names.size() != gradients.size()) {
               throw py::value_error(absl::StrCat(names.size(), " names for ", gradients.size(),
                                                  " gradients"));
             }
             std::vector<std::span<const float>> spans;
             for (const auto& g : gradients) {
               spans.emplace_back(g.data(), static_cast<size_t>(g.size()));
             }
             t.RecordWindow(step, loss, samples, staleness, version, names, spans);
           })
      .def("record_evaluation", &WorkerTelemetry::RecordEvaluation, py::arg("epochs_done"),
           py::arg("step"), py::arg("test_loss"), py::arg("accuracy"))
      .def_property_readonly("result_json", [](const WorkerTelemetry& t) {
        std::string json;
        google::protobuf::util::JsonPrintOptions options;
        options.preserve_proto_field_names = true;
        if (!google::protobuf::util::MessageToJsonString(t.result(), &json, options).ok()) {
          Raise(absl::InternalError("cannot print the worker result"));
        }
        return json;
      });
}

}  // namespace pst
