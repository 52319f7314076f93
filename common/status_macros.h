// Early returns for absl::Status and absl::StatusOr, as TensorFlow's
// TF_RETURN_IF_ERROR and TF_ASSIGN_OR_RETURN: the error is returned as it
// is, so whatever named it (a shard, a file, a flag) stays in it.
//
//   PST_RETURN_IF_ERROR(store.Validate(request));
//   PST_ASSIGN_OR_RETURN(std::unique_ptr<Shard> shard, Shard::Create(options));
#ifndef PST_COMMON_STATUS_MACROS_H_
#define PST_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define PST_RETURN_IF_ERROR(expr)                                           \
  do {                                                                      \
    if (::absl::Status pst_status_ = (expr); !pst_status_.ok()) {           \
      return pst_status_;                                                   \
    }                                                                       \
  } while (false)

#define PST_STATUS_CONCAT_INNER_(a, b) a##b
#define PST_STATUS_CONCAT_(a, b) PST_STATUS_CONCAT_INNER_(a, b)

#define PST_ASSIGN_OR_RETURN(lhs, expr) \
  PST_ASSIGN_OR_RETURN_IMPL_(PST_STATUS_CONCAT_(pst_statusor_, __LINE__), lhs, expr)

#define PST_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                               \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = *std::move(statusor)

#endif  // PST_COMMON_STATUS_MACROS_H_
