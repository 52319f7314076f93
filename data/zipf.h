// Draws ranks 1..n with probability proportional to rank^-exponent, in O(1)
// per draw and O(1) memory whatever n (rejection-inversion: W. Hörmann and
// G. Derflinger, "Rejection-inversion to generate variates from monotone
// discrete distributions", 1996), so fields of 10^8 distinct values cost no
// table.
#ifndef PST_DATA_ZIPF_H_
#define PST_DATA_ZIPF_H_

#include <cstdint>
#include <random>

namespace pst {

class ZipfSampler {
 public:
  // n >= 1, exponent > 0.
  ZipfSampler(int64_t n, double exponent);
  int64_t Draw(std::mt19937_64& rng) const;

 private:
  double H(double x) const;          // the hat function's integral
  double HInverse(double x) const;
  double h(double x) const;          // the hat, x^-exponent
  int64_t n_;
  double exponent_;
  double h_integral_x1_;
  double h_integral_n_;
  double s_;
};

// A uniform double in [0, 1) from 53 of the generator's bits: the mapping
// is fixed here, so every standard library draws the same values.
inline double Uniform(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

}  // namespace pst

#endif  // PST_DATA_ZIPF_H_
