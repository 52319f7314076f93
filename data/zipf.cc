#include "data/zipf.h"

#include <algorithm>
#include <cmath>

namespace pst {
namespace {

// log1p(x) / x and expm1(x) / x, accurate near 0.
double Log1pOverX(double x) {
  return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
}
double Expm1OverX(double x) {
  return std::abs(x) > 1e-8 ? std::expm1(x) / x
                            : 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
}

}  // namespace

ZipfSampler::ZipfSampler(int64_t n, double exponent) : n_(n), exponent_(exponent) {
  h_integral_x1_ = H(1.5) - 1.0;
  h_integral_n_ = H(static_cast<double>(n_) + 0.5);
  s_ = 2.0 - HInverse(H(2.5) - h(2.0));
}

double ZipfSampler::h(double x) const { return std::exp(-exponent_ * std::log(x)); }

double ZipfSampler::H(double x) const {
  const double log_x = std::log(x);
  return Expm1OverX((1.0 - exponent_) * log_x) * log_x;
}

double ZipfSampler::HInverse(double x) const {
  const double t = std::max(-1.0, x * (1.0 - exponent_));
  return std::exp(Log1pOverX(t) * x);
}

int64_t ZipfSampler::Draw(std::mt19937_64& rng) const {
  while (true) {
    const double u = h_integral_n_ + Uniform(rng) * (h_integral_x1_ - h_integral_n_);
    const double x = HInverse(u);
    const int64_t k = std::clamp<int64_t>(static_cast<int64_t>(x + 0.5), 1, n_);
    const double kd = static_cast<double>(k);
    if (kd - x <= s_ || u >= H(kd + 0.5) - h(kd)) return k;
  }
}

}  // namespace pst
