// A CTR job's data files (training.dataset.ctr): generated from the planted
// model on first use when the config asks for it, once per host however
// many workers start at once.
#ifndef PST_WORKER_TRAINING_CTR_DATA_H_
#define PST_WORKER_TRAINING_CTR_DATA_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "config.pb.h"
#include "data/ctr_generator.h"
#include "data/ctr_reader.h"

namespace pst {

// The generator's options from the config, defaults filled in (the job's
// seed when the generator names none).
CtrGeneratorOptions GeneratorOptionsFrom(const CtrDataConfig& data, uint64_t job_seed);

// The reader options of worker `rank` of `workers`.
CtrReaderOptions ReaderOptionsFrom(const CtrDataConfig& data, int rank, int workers);

// Makes sure both files exist. With `generate` set, writes them (holding a
// lock on "<test_file>.lock", so concurrent workers generate once) when one
// is missing or the planted record beside the test file names other
// options, and returns the planted model's scores; without it, only checks
// the files (NotFound naming the missing one) and returns nullopt.
absl::StatusOr<std::optional<PlantedModel>> PrepareCtrFiles(const TrainingConfig& training);

}  // namespace pst

#endif  // PST_WORKER_TRAINING_CTR_DATA_H_
