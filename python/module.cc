// pstrain._pstrain: the Python binding of a worker's session with the PS
// shards (worker/session/client_session.h). It only translates: buffers in (any
// object with the buffer protocol holding C-contiguous float32, read where
// it lies), NumPy views out (the session's tensors, where they lie), an
// absl::Status as a pstrain.Error (python/pstrain/errors.py), and every wait
// on the network without the GIL. Every call that takes the session's lock
// lets go of the GIL first: one that waits for another thread's exchange
// must not stop the interpreter meanwhile. The user API is the pure-Python
// package around it (python/pstrain/__init__.py).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/flags.h"
#include "common/mutex_checks.h"
#include "common/process_memory.h"
#include "google/protobuf/util/json_util.h"
#include "python/binding.h"
#include "worker/session/client_session.h"
#include "python/telemetry_binding.h"
#include "python/worker_telemetry.h"
#include "spdlog/spdlog.h"

namespace py = pybind11;

namespace pst {
namespace {

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  if (!google::protobuf::util::MessageToJsonString(message, &json, options).ok()) {
    ThrowIfError(absl::InternalError(absl::StrCat("cannot print a ", message.GetTypeName())));
  }
  return json;
}

// The buffers of `arrays` (one per declared variable, in order) as spans,
// checked against the variables' sizes. The views stay open while `held`
// lives, which must end with the GIL held.
template <typename Float>
std::vector<std::span<Float>> Spans(const ClientSession& session, const py::sequence& arrays,
                                    const char* what, std::vector<py::buffer_info>* held) {
  const std::vector<VariableSpec>& variables = session.variables();
  if (static_cast<size_t>(py::len(arrays)) != variables.size()) {
    throw py::value_error(absl::StrCat("got ", py::len(arrays), " ", what, " for the ",
                                       variables.size(), " declared variables"));
  }
  std::vector<std::span<Float>> spans;
  for (size_t i = 0; i < variables.size(); ++i) {
    spans.push_back(BufferSpan<Float>(arrays[i], absl::StrCat(what, " of ", variables[i].name),
                                      variables[i].size(), held));
  }
  return spans;
}

// NumPy arrays viewing `spans` (the session's own memory, shaped like the
// variables); each keeps `owner` alive.
py::list Views(const ClientSession& session, const std::vector<std::span<float>>& spans,
               py::handle owner) {
  py::list views;
  for (size_t i = 0; i < spans.size(); ++i) {
    const std::vector<int64_t>& shape = session.variables()[i].shape;
    std::vector<py::ssize_t> dims(shape.begin(), shape.end());
    views.append(py::array_t<float>(dims, spans[i].data(), owner));
  }
  return views;
}

py::dict RegisterAnswer(const RegisterResponse& view) {
  py::dict answer;
  answer["mode"] = Mode_Name(view.mode());
  answer["workers"] = view.workers();
  answer["version"] = view.version();
  answer["initialized"] = view.initialized();
  answer["num_shards"] = view.num_shards();
  answer["worker_clock"] = view.worker_clock();
  return answer;
}

}  // namespace
}  // namespace pst

PYBIND11_MODULE(_pstrain, m) {
  using pst::ClientSession;
  m.doc() = "The compiled core of pstrain: a worker's session with the PS shards.";
  // As the worker binary's main does: each step's large exchange buffers are
  // reused warm instead of faulted in afresh (on import, before the session
  // starts gRPC's threads).
  pst::KeepLargeBuffersWarm();
  pst::SkipMutexDeadlockChecks();
  // The programs' log format, for the session's own lines and pstrain's
  // (log below), so that a job's log reads alike whatever its workers run.
  spdlog::set_pattern(pst::kLogPattern);
  m.def(
      "log",
      [](const std::string& level, const std::string& message) {
        spdlog::log(spdlog::level::from_str(level), "{}", message);
      },
      py::arg("level"), py::arg("message"),
      "Logs one line as the C++ programs do: level is info, warning or error.");
  pst::BindWorkerTelemetry(m);
  // What Session.declare takes in all (common/config.h).
  m.attr("MAX_MODEL_PARAMETERS") = pst::kMaxModelParameters;

  py::register_exception_translator([](std::exception_ptr thrown) {
    try {
      if (thrown) std::rethrow_exception(thrown);
    } catch (const pst::StatusError& error) {
      const absl::Status& status = error.status;
      py::object make = py::module_::import("pstrain.errors").attr("from_status");
      py::object exception =
          make(absl::StatusCodeToString(status.code()), std::string(status.message()),
               pst::IsTransientShardError(status));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exception.ptr())), exception.ptr());
    }
  });

  py::class_<ClientSession>(m, "Session")
      .def_static(
          "open",
          [](const std::string& config, const std::string& task, double connect_timeout) {
            absl::StatusOr<std::unique_ptr<ClientSession>> session;
            {
              py::gil_scoped_release unlocked;
              session = ClientSession::Open(config, task, absl::Seconds(connect_timeout));
            }
            // Its metrics are named after the worker before any exchange.
            if (session.ok()) pst::NameWorkerProcess((*session)->worker());
            return pst::ValueOrThrow(std::move(session));
          },
          py::arg("config"), py::arg("task"), py::arg("connect_timeout"))
      .def_property_readonly("config_json",
                             [](const ClientSession& s) { return pst::ToJson(s.config()); })
      .def_property_readonly("worker", &ClientSession::worker)
      .def_property_readonly("num_shards", &ClientSession::num_shards)
      .def("uses_shared_memory",
           [](const ClientSession& s, int shard) {
             if (shard < 0 || shard >= s.num_shards()) throw py::index_error("no such shard");
             py::gil_scoped_release unlocked;
             return s.uses_shared_memory(shard);
           })
      .def("register",
           [](ClientSession& s) {
             absl::StatusOr<pst::RegisterResponse> view;
             {
               py::gil_scoped_release unlocked;
               view = s.Register();
             }
             return pst::RegisterAnswer(pst::ValueOrThrow(std::move(view)));
           })
      .def("declare",
           [](ClientSession& s, const std::vector<std::pair<std::string, std::vector<int64_t>>>&
                                    variables) {
             std::vector<pst::VariableSpec> specs;
             for (const auto& [name, shape] : variables) specs.push_back({name, shape});
             py::gil_scoped_release unlocked;
             pst::ThrowIfError(s.Declare(std::move(specs)));
           })
      .def_property_readonly("declared", &ClientSession::declared)
      .def_property_readonly("variables",
                             [](const ClientSession& s) {
                               std::vector<std::pair<std::string, std::vector<int64_t>>> out;
                               for (const pst::VariableSpec& v : s.variables()) {
                                 out.emplace_back(v.name, v.shape);
                               }
                               return out;
                             })
      .def("values",
           [](py::object self) {
             const ClientSession& s = self.cast<const ClientSession&>();
             if (!s.declared()) throw py::value_error("no variables declared yet");
             return pst::Views(s, s.tensors().values, self);
           })
      .def("gradients",
           [](py::object self) {
             const ClientSession& s = self.cast<const ClientSession&>();
             if (!s.declared()) throw py::value_error("no variables declared yet");
             return pst::Views(s, s.tensors().gradients, self);
           })
      .def("init",
           [](ClientSession& s, const py::sequence& values) {
             std::vector<py::buffer_info> held;
             auto spans = pst::Spans<const float>(s, values, "initial values", &held);
             absl::StatusOr<bool> accepted;
             {
               py::gil_scoped_release unlocked;
               accepted = s.Init(spans);
             }
             return pst::ValueOrThrow(std::move(accepted));
           })
      .def("pull",
           [](ClientSession& s, const py::sequence& out) {
             std::vector<py::buffer_info> held;
             auto spans = pst::Spans<float>(s, out, "pull destination", &held);
             absl::Status status;
             {
               py::gil_scoped_release unlocked;
               status = s.Pull(spans);
             }
             pst::ThrowIfError(status);
           })
      .def("push",
           [](ClientSession& s, const py::sequence& gradients) {
             std::vector<py::buffer_info> held;
             auto spans = pst::Spans<const float>(s, gradients, "gradient", &held);
             absl::Status status;
             {
               py::gil_scoped_release unlocked;
               status = s.Push(spans);
             }
             pst::ThrowIfError(status);
           })
      .def("push_pull",
           [](ClientSession& s, const py::sequence& gradients, const py::sequence& out) {
             std::vector<py::buffer_info> held;
             auto in = pst::Spans<const float>(s, gradients, "gradient", &held);
             auto spans = pst::Spans<float>(s, out, "pull destination", &held);
             absl::Status status;
             {
               py::gil_scoped_release unlocked;
               status = s.PushPull(in, spans);
             }
             pst::ThrowIfError(status);
           })
      .def("done",
           [](ClientSession& s) {
             absl::Status status;
             {
               py::gil_scoped_release unlocked;
               status = s.Done();
             }
             pst::ThrowIfError(status);
           })
      .def("stats_json",
           [](ClientSession& s, int shard) {
             absl::StatusOr<pst::StatsResponse> stats;
             {
               py::gil_scoped_release unlocked;
               stats = s.Stats(shard);
             }
             return pst::ToJson(pst::ValueOrThrow(std::move(stats)));
           })
      .def("await_workers_done_json",
           [](ClientSession& s, int64_t known_changes, double timeout) {
             absl::StatusOr<pst::StatsResponse> stats;
             {
               py::gil_scoped_release unlocked;
               stats = s.AwaitWorkersDone(known_changes, absl::Seconds(timeout));
             }
             return pst::ToJson(pst::ValueOrThrow(std::move(stats)));
           })
      // The session's counters wait for the exchange in flight: read without the GIL.
      .def_property_readonly("versions",
                             [](const ClientSession& s) {
                               py::gil_scoped_release unlocked;
                               return s.versions();
                             })
      .def_property_readonly("pushes",
                             [](const ClientSession& s) {
                               py::gil_scoped_release unlocked;
                               return s.pushes();
                             })
      .def_property_readonly("redone_steps",
                             [](const ClientSession& s) {
                               py::gil_scoped_release unlocked;
                               return s.redone_steps();
                             })
      .def_property_readonly("staleness_total",
                             [](const ClientSession& s) {
                               py::gil_scoped_release unlocked;
                               return s.staleness_total();
                             })
      .def_property_readonly("last_outcomes", [](const ClientSession& s) {
        std::vector<pst::PushResponse> responses;
        {
          py::gil_scoped_release unlocked;
          responses = s.last_responses();
        }
        std::vector<std::string> outcomes;
        for (const pst::PushResponse& r : responses) {
          outcomes.push_back(pst::PushResponse::Outcome_Name(r.outcome()));
        }
        return outcomes;
      });
  pst::BindRows(m);
}
