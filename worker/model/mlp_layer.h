// Mlp's layer record, shared by the files that implement Mlp (mlp.cc,
// mlp_tensors.cc); nothing else includes it.
#ifndef PST_WORKER_MODEL_MLP_LAYER_H_
#define PST_WORKER_MODEL_MLP_LAYER_H_

#include "worker/model/mlp.h"

namespace pst {

// Device buffers of one dense layer, sized for max_batch rows.
struct Mlp::Layer {
  int in = 0;
  int out = 0;
  float* weights = nullptr;       // [in, out]
  float* bias = nullptr;          // [out], null without bias
  float* weights_grad = nullptr;  // [in, out]
  float* bias_grad = nullptr;     // [out]
  float* output = nullptr;        // [max_batch, out], after the activation
  float* output_grad = nullptr;   // [max_batch, out], d loss / d pre-activation
  int weights_var = -1;           // index into variables_
  int bias_var = -1;
};

}  // namespace pst

#endif  // PST_WORKER_MODEL_MLP_LAYER_H_
