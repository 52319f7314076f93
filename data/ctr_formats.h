// Parsers of one line of the click-through-rate formats, appending one
// example to a CtrBatch. Each returns InvalidArgument saying what is wrong
// with the line (the reader adds the file and line number) and leaves the
// batch as it was.
#ifndef PST_DATA_CTR_FORMATS_H_
#define PST_DATA_CTR_FORMATS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "data/ctr_batch.h"

namespace pst {

enum class CtrFormat { kCriteo, kLibsvm };

// Criteo's TSV: a 0/1 label, kCriteoIntegers integer columns and
// kCriteoCategoricals categorical columns of hexadecimal hashes (up to 16
// digits), tab-separated; any feature column may be empty (missing). An
// integer x becomes the dense feature sign(x) log(1 + |x|) (0 when
// missing); a hash h of column f becomes one id, CategoricalId(f, h), of
// value 1 (an empty bag when missing).
inline constexpr int kCriteoIntegers = 13;
inline constexpr int kCriteoCategoricals = 26;
absl::Status ParseCriteoLine(absl::string_view line, CtrBatch* batch);

// libsvm/svmlight: "label idx:val idx:val ... [# comment]", separated by
// spaces or tabs; a label > 0 is a click (1), any other a 0. The pairs form
// one multi-valued field: id idx (an unsigned integer), value val. No dense
// features.
absl::Status ParseLibsvmLine(absl::string_view line, CtrBatch* batch);

// The batch shape each format's examples have.
CtrBatch EmptyBatchFor(CtrFormat format);

}  // namespace pst

#endif  // PST_DATA_CTR_FORMATS_H_
