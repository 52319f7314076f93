// The Session's embedding-table calls: ids as 64-bit integer buffers and
// rows as float32 buffers, read and written where they lie, every wait
// (also for the session's lock) without the GIL. Tables are named by index
// (Session.tables' order); pstrain.Client maps names to indices.
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <utility>

#include "google/protobuf/util/json_util.h"

#include "python/binding.h"
#include "worker/session/client_session.h"

namespace py = pybind11;

namespace pst {
namespace {

// A message the Python side wrote as JSON (protobuf's JSON mapping);
// ValueError naming `what` for one that does not parse.
template <typename Message>
Message FromJson(const std::string& json, const char* what) {
  Message message;
  if (const auto parsed = google::protobuf::util::JsonStringToMessage(json, &message);
      !parsed.ok()) {
    throw py::value_error(std::string(what) + ": " + parsed.ToString());
  }
  return message;
}

// (table, ids, rows) triples as RowGradients or RowValues; the buffers stay
// open while `held` lives.
template <typename Rows>
std::vector<Rows> RowList(const py::sequence& triples, const char* what,
                          std::vector<py::buffer_info>* held) {
  using Element = std::conditional_t<std::is_same_v<Rows, RowValues>, float, const float>;
  std::vector<Rows> list;
  for (py::handle item : triples) {
    py::tuple triple = py::reinterpret_borrow<py::tuple>(item);
    if (triple.size() != 3) throw py::value_error("rows are (table, ids, rows) triples");
    Rows rows;
    rows.table = triple[0].cast<int>();
    rows.ids = BufferSpan<const uint64_t>(triple[1], absl::StrCat(what, " ids"), -1, held);
    std::span<Element> data = BufferSpan<Element>(triple[2], what, -1, held);
    if constexpr (std::is_same_v<Rows, RowValues>) {
      rows.values = data;
    } else {
      rows.gradients = data;
    }
    list.push_back(rows);
  }
  return list;
}

std::vector<std::span<const float>> DenseIn(const ClientSession& s, const py::sequence& arrays,
                                            std::vector<py::buffer_info>* held) {
  std::vector<std::span<const float>> spans;
  for (size_t i = 0; i < static_cast<size_t>(py::len(arrays)); ++i) {
    spans.push_back(BufferSpan<const float>(arrays[i], "gradient", -1, held));
  }
  return spans;
}

std::vector<std::span<float>> DenseOut(const ClientSession& s, const py::sequence& arrays,
                                       std::vector<py::buffer_info>* held) {
  std::vector<std::span<float>> spans;
  for (size_t i = 0; i < static_cast<size_t>(py::len(arrays)); ++i) {
    spans.push_back(BufferSpan<float>(arrays[i], "pull destination", -1, held));
  }
  return spans;
}

// Spans' sizes against the declared variables: one per variable, of its size.
template <typename Float>
void CheckSizes(const ClientSession& s, const std::vector<std::span<Float>>& spans,
                const char* what) {
  const std::vector<VariableSpec>& variables = s.variables();
  if (spans.size() != variables.size()) {
    throw py::value_error(absl::StrCat("got ", spans.size(), " ", what, " for the ",
                                       variables.size(), " declared variables"));
  }
  for (size_t i = 0; i < variables.size(); ++i) {
    if (static_cast<int64_t>(spans[i].size()) != variables[i].size()) {
      throw py::value_error(absl::StrCat("the arrays of ", variables[i].name, " must have ",
                                         variables[i].size(), " elements"));
    }
  }
}

// The dense spans' sizes against the declared variables.
void CheckDense(const ClientSession& s, const std::vector<std::span<const float>>& in,
                const std::vector<std::span<float>>& out) {
  CheckSizes(s, in, "gradients");
  CheckSizes(s, out, "pull destinations");
}

}  // namespace

void BindRows(py::module_& module) {
  py::object bound = module.attr("Session");
  auto session = py::reinterpret_borrow<py::class_<ClientSession>>(bound);
  session
      .def(
          "declare_tables",
          [](ClientSession& s, const std::vector<std::pair<std::string, int>>& tables,
             const std::optional<std::string>& optimizer_json) {
            std::optional<OptimizerConfig> optimizer;
            if (optimizer_json) optimizer = FromJson<OptimizerConfig>(*optimizer_json, "optimizer");
            absl::Status status;
            {
              py::gil_scoped_release unlocked;
              status = s.DeclareTables(tables, optimizer ? &*optimizer : nullptr);
            }
            ThrowIfError(status);
          },
          py::arg("tables"), py::arg("optimizer_json") = std::nullopt)
      .def("init_with_rows",
           [](ClientSession& s, const py::sequence& values, const py::sequence& rows) {
             std::vector<py::buffer_info> held;
             const std::vector<std::span<const float>> spans = DenseIn(s, values, &held);
             CheckSizes(s, spans, "initial values");
             const std::vector<RowGradients> seeds = RowList<RowGradients>(rows, "initial rows", &held);
             absl::StatusOr<bool> accepted;
             {
               py::gil_scoped_release unlocked;
               accepted = s.InitWithRows(spans, seeds);
             }
             return ValueOrThrow(std::move(accepted));
           })
      .def("set_optimizer",
           [](ClientSession& s, const std::string& optimizer_json) {
             const OptimizerConfig optimizer = FromJson<OptimizerConfig>(optimizer_json, "optimizer");
             absl::Status status;
             {
               py::gil_scoped_release unlocked;
               status = s.SetDenseOptimizer(optimizer);
             }
             ThrowIfError(status);
           })
      .def("set_rates",
           [](ClientSession& s, const std::optional<std::string>& rates_json) {
             std::optional<UpdateRates> rates;
             if (rates_json) rates = FromJson<UpdateRates>(*rates_json, "rates");
             absl::Status status;
             {
               py::gil_scoped_release unlocked;
               status = s.SetUpdateRates(rates);
             }
             ThrowIfError(status);
           })
      .def_property_readonly("tables",
                             [](const ClientSession& s) {
                               std::vector<EmbeddingTableConfig> configs;
                               {
                                 py::gil_scoped_release unlocked;
                                 configs = s.tables();
                               }
                               std::vector<std::pair<std::string, int>> tables;
                               for (const EmbeddingTableConfig& t : configs) {
                                 tables.emplace_back(t.name(), t.dim());
                               }
                               return tables;
                             })
      .def("pull_rows",
           [](ClientSession& s, const py::sequence& pulls) {
             std::vector<py::buffer_info> held;
             const std::vector<RowValues> rows = RowList<RowValues>(pulls, "pulled rows", &held);
             absl::Status status;
             {
               py::gil_scoped_release unlocked;
               status = s.PullRows(rows);
             }
             ThrowIfError(status);
           })
      .def("push_rows",
           [](ClientSession& s, const py::sequence& pushes) {
             std::vector<py::buffer_info> held;
             const std::vector<RowGradients> rows =
                 RowList<RowGradients>(pushes, "row gradients", &held);
             absl::Status status;
             {
               py::gil_scoped_release unlocked;
               status = s.PushRows(rows);
             }
             ThrowIfError(status);
           })
      .def("push_pull_rows", [](ClientSession& s, const py::sequence& gradients,
                                const py::sequence& out, const py::sequence& pushes,
                                const py::sequence& pulls) {
        std::vector<py::buffer_info> held;
        const std::vector<std::span<const float>> in = DenseIn(s, gradients, &held);
        const std::vector<std::span<float>> values = DenseOut(s, out, &held);
        CheckDense(s, in, values);
        const std::vector<RowGradients> push = RowList<RowGradients>(pushes, "row gradients", &held);
        const std::vector<RowValues> pull = RowList<RowValues>(pulls, "pulled rows", &held);
        absl::Status status;
        {
          py::gil_scoped_release unlocked;
          status = s.PushPullRows(in, values, {.push = push, .pull = pull});
        }
        ThrowIfError(status);
      });
}

}  // namespace pst
