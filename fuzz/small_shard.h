// The shard the request fuzzers drive: ASYNC, one worker, SGD, holding
// "w" [2, 3], "b" [3] and "v" [64], and the embedding tables "e" (dim 4,
// at most 64 rows) and "f" (dim 1, at most 8 rows, so that new rows are
// soon refused at the limit): small enough for every input to reach its
// variables and rows, with names and shapes a fuzzer finds quickly.
#ifndef PST_FUZZ_SMALL_SHARD_H_
#define PST_FUZZ_SMALL_SHARD_H_

#include <cstdio>
#include <memory>
#include <vector>

#include "common/tensor_codec.h"
#include "ps_server/core/parameter_shard.h"

// A promise a fuzzer checks: broken, it is reported on stderr and the run
// ends with a trap, which libFuzzer reports with the input.
#define FUZZ_INVARIANT(cond)                                                                     \
  do {                                                                                           \
    if (!(cond)) {                                                                               \
      std::fprintf(stderr, "fuzzer invariant broken at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      __builtin_trap();                                                                          \
    }                                                                                            \
  } while (0)

namespace pst::fuzz {

inline std::unique_ptr<ParameterShard> MakeSmallShard() {
  ShardOptions options;
  options.mode = ASYNC;
  options.num_workers = 1;
  options.optimizer.mutable_sgd()->set_learning_rate(0.5f);
  absl::StatusOr<std::unique_ptr<ParameterShard>> shard = ParameterShard::Create(options);
  FUZZ_INVARIANT(shard.ok());
  InitRequest init;
  EncodeTensor("w", std::vector<int64_t>{2, 3}, std::vector<float>(6, 0.5f), init.add_variables());
  EncodeTensor("b", std::vector<int64_t>{3}, std::vector<float>(3, 0.0f), init.add_variables());
  EncodeTensor("v", std::vector<int64_t>{64}, std::vector<float>(64, 1.0f), init.add_variables());
  EmbeddingTableConfig* e = init.add_embeddings();
  e->set_name("e");
  e->set_dim(4);
  e->set_max_rows_per_shard(64);
  EmbeddingTableConfig* f = init.add_embeddings();
  f->set_name("f");
  f->set_dim(1);
  f->set_max_rows_per_shard(8);
  InitResponse response;
  FUZZ_INVARIANT((*shard)->Init(init, &response).ok());
  return std::move(*shard);
}

}  // namespace pst::fuzz

#endif  // PST_FUZZ_SMALL_SHARD_H_
