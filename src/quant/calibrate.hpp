// Calibrated conversion (ConvertOptions::calibration = kText): calibration tokens, Hessian
// capture through the runtime's DecoderLayer, and the layer-by-layer streaming loop.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "exl3/quant/convert.hpp"
#include "exl3/runtime/decoder_layer.hpp"

namespace exl3::quant::detail {

// rows * length token ids: `text` tokenized with `in_dir`/tokenizer.json (with its special
// tokens, e.g. a BOS), cut into consecutive rows. Throws exl3::Error naming the label when the
// text is empty, not enough tokens, or the ids fall outside vocab_size.
std::vector<int32_t> calibration_tokens(const std::filesystem::path& in_dir, std::string_view text,
                                        const std::string& label, int64_t rows, int64_t length,
                                        int64_t vocab_size);

// How many rows of `length` tokens `text` fills (tokenized as calibration_tokens does), at most
// kMaxAutoCalibrationRows. Throws exl3::Error naming the label when it fills none.
int64_t calibration_rows_for(const std::filesystem::path& in_dir, std::string_view text,
                             const std::string& label, int64_t length);

// Sums X^T X (fp64) of every input a layer's linears read; linears that share an input share
// one accumulator (q/k/v, gate/up). A routed expert accumulates only the rows routed to it.
class HessianCapture final : public runtime::LinearObserver {
 public:
  struct Sum {
    int64_t in = 0;
    int64_t count = 0;        // rows accumulated
    std::vector<double> xtx;  // [in, in], lower triangle (j <= i) filled
  };
  void observe(std::span<const std::string> linears, const float* x, int64_t m,
               int64_t in) override;
  // nullptr when `linear` never saw an input (an expert no calibration token was routed to).
  const Sum* find(const std::string& linear) const;
  // H = X^T X / count ([in, in], full symmetric) of `linear`; empty when find() is nullptr.
  std::vector<double> mean(const std::string& linear) const;
  void clear() { sums_.clear(); }

 private:
  std::map<std::string, std::shared_ptr<Sum>> sums_;
};

// Adds x[m, in]^T x to the lower triangle of s.xtx.
void accumulate_xtx(HessianCapture::Sum& s, const float* x, int64_t m);

// The rows of `states` ([rows * length, hidden]) through `layer`, each row one sequence,
// in place; with an observer every linear input is shown to it. dsa (DSA models): each row's
// token selection as the layers hand it on (DecoderLayer::forward_sequence).
void run_layer_rows(const runtime::DecoderLayer& layer, std::vector<float>& states, int64_t rows,
                    int64_t length, int64_t hidden, runtime::LinearObserver* observer,
                    std::vector<runtime::DsaSelection>* dsa = nullptr);

// The calibrated item loop. `run_item(index, hessian)` stages (or resumes) plan item `index`
// with an optional Hessian (H = X^T X / n, [in, in] fp64), as the uncalibrated loop does.
struct CalibratedRun {
  const ConversionPlan* plan = nullptr;
  std::filesystem::path in_dir;
  std::filesystem::path work_dir;  // OUT/.exl3-partial: holds states_{L}.safetensors
  const ConvertOptions* options = nullptr;
  std::function<bool(int64_t)> item_done;  // staged by this or an earlier run
  std::function<std::filesystem::path(int64_t)> unit_file;
  std::function<void(int64_t, const std::vector<double>*)> run_item;
  double started = 0.0;
};
void run_calibrated(const CalibratedRun& r);

}  // namespace exl3::quant::detail
