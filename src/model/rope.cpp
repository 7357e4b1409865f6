// RoPE settings from config.json and the cos/sin tables (see rope.hpp).
#include "exl3/model/rope.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>

#include "exl3/error.hpp"

namespace exl3::model {
namespace {

using nlohmann::json;

const json* get(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(key);
  return (it == j.end() || it->is_null()) ? nullptr : &*it;
}

// A positive finite number at `where.key`; `def` when absent (nullopt def = required).
double number(const json& j, const char* key, const std::string& where, const std::string& label,
              std::optional<double> def, bool positive = true) {
  const json* v = get(j, key);
  if (v == nullptr) {
    if (def) return *def;
    fail("{}: key '{}{}' is required for this rope type", label, where, key);
  }
  if (!v->is_number())
    fail("{}: key '{}{}': expected a number, got {}", label, where, key, v->dump());
  const double d = v->get<double>();
  if (!std::isfinite(d) || (positive && d <= 0.0)) {
    fail("{}: key '{}{}': expected a positive number, got {}", label, where, key, v->dump());
  }
  return d;
}

}  // namespace

std::string_view rope_type_name(RopeType t) {
  switch (t) {
    case RopeType::kDefault:
      return "default";
    case RopeType::kLinear:
      return "linear";
    case RopeType::kLlama3:
      return "llama3";
    case RopeType::kYarn:
      return "yarn";
  }
  return "?";
}

RopeSpec parse_rope(const json& config, int64_t head_dim, const std::string& label) {
  RopeSpec r;
  r.head_dim = head_dim;
  // transformers 5 keeps everything in rope_parameters; 4.x has rope_theta + rope_scaling.
  const json* params = get(config, "rope_parameters");
  std::string where = "rope_parameters.";
  if (params != nullptr && !params->is_object()) {
    fail("{}: key 'rope_parameters': expected an object, got {}", label, params->dump());
  }
  if (params == nullptr) {
    params = get(config, "rope_scaling");
    where = "rope_scaling.";
    if (params != nullptr && !params->is_object()) {
      fail("{}: key 'rope_scaling': expected an object or null, got {}", label, params->dump());
    }
  }
  static const json kEmpty = json::object();
  const json& p = params != nullptr ? *params : kEmpty;

  if (get(p, "rope_theta") != nullptr) {
    r.theta = number(p, "rope_theta", where, label, std::nullopt);
  } else {
    r.theta = number(config, "rope_theta", "", label, 10000.0);
  }
  double partial = 1.0;
  if (get(p, "partial_rotary_factor") != nullptr) {
    partial = number(p, "partial_rotary_factor", where, label, std::nullopt);
  } else {
    partial = number(config, "partial_rotary_factor", "", label, 1.0);
  }
  if (partial > 1.0) {
    fail("{}: key 'partial_rotary_factor': {} is above 1 (the rotated part of a head)", label,
         partial);
  }
  r.rotary_dim = static_cast<int64_t>(static_cast<double>(head_dim) * partial);  // python int()
  if (r.rotary_dim <= 0 || r.rotary_dim % 2 != 0) {
    fail(
        "{}: key 'partial_rotary_factor': head_dim {} x {} gives {} rotary channels; expected a "
        "positive even number",
        label, head_dim, partial, r.rotary_dim);
  }

  std::string type = "default";
  const char* type_key = "rope_type";
  for (const char* key : {"rope_type", "type"}) {
    if (const json* t = get(p, key)) {
      if (!t->is_string())
        fail("{}: key '{}{}': expected a string, got {}", label, where, key, t->dump());
      type = t->get<std::string>();
      type_key = key;
      break;
    }
  }
  const int64_t max_pos = [&]() -> int64_t {
    const json* m = get(config, "max_position_embeddings");
    return (m != nullptr && m->is_number_integer()) ? m->get<int64_t>() : 0;
  }();
  auto original_max = [&](bool required) -> int64_t {
    const json* o = get(p, "original_max_position_embeddings");
    if (o == nullptr) {
      if (!required && max_pos > 0) return max_pos;
      fail("{}: key '{}original_max_position_embeddings' is required for rope type '{}'", label,
           where, type);
    }
    if (!o->is_number_integer() || o->get<int64_t>() <= 0) {
      fail("{}: key '{}original_max_position_embeddings': expected a positive integer, got {}",
           label, where, o->dump());
    }
    return o->get<int64_t>();
  };

  if (type == "default") {
    r.type = RopeType::kDefault;
  } else if (type == "linear") {
    r.type = RopeType::kLinear;
    r.factor = number(p, "factor", where, label, std::nullopt);
  } else if (type == "llama3") {
    r.type = RopeType::kLlama3;
    r.factor = number(p, "factor", where, label, std::nullopt);
    r.low_freq_factor = number(p, "low_freq_factor", where, label, std::nullopt);
    r.high_freq_factor = number(p, "high_freq_factor", where, label, std::nullopt);
    if (r.high_freq_factor <= r.low_freq_factor) {
      fail("{}: key '{}high_freq_factor': {} must be above low_freq_factor {}", label, where,
           r.high_freq_factor, r.low_freq_factor);
    }
    r.original_max_position_embeddings = original_max(true);
  } else if (type == "yarn") {
    // The factor as written (vLLM's reading; some transformers versions re-derive it from
    // max_position_embeddings / original_max_position_embeddings instead).
    r.type = RopeType::kYarn;
    r.factor = number(p, "factor", where, label, std::nullopt);
    r.original_max_position_embeddings = original_max(false);
    r.beta_fast = number(p, "beta_fast", where, label, 32.0);
    r.beta_slow = number(p, "beta_slow", where, label, 1.0);
    if (const json* t = get(p, "truncate")) {
      if (!t->is_boolean()) fail("{}: key '{}truncate': expected true or false", label, where);
      r.truncate = t->get<bool>();
    }
    auto mscale_of = [](double scale, double m) {
      return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
    };
    if (get(p, "attention_factor") != nullptr) {
      r.attention_factor = number(p, "attention_factor", where, label, std::nullopt);
    } else {
      const double ms = number(p, "mscale", where, label, 0.0, false);
      const double msa = number(p, "mscale_all_dim", where, label, 0.0, false);
      r.attention_factor = (ms != 0.0 && msa != 0.0)
                               ? mscale_of(r.factor, ms) / mscale_of(r.factor, msa)
                               : mscale_of(r.factor, 1.0);
    }
  } else {
    fail(
        "{}: key '{}{}': rope type '{}' is not supported (supported: default, linear, llama3, "
        "yarn)",
        label, where, type_key, type);
  }
  return r;
}

std::vector<float> rope_inv_freq(const RopeSpec& r) {
  const int64_t half = r.half();
  const double dim = static_cast<double>(r.rotary_dim);
  std::vector<float> out(static_cast<size_t>(half));
  std::vector<double> base(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    // transformers: 1 / theta^(arange(0, dim, 2).float() / dim), in fp32.
    const float expo = static_cast<float>(2 * i) / static_cast<float>(r.rotary_dim);
    base[static_cast<size_t>(i)] = static_cast<double>(static_cast<float>(
        1.0 /
        static_cast<double>(static_cast<float>(std::pow(r.theta, static_cast<double>(expo))))));
  }
  switch (r.type) {
    case RopeType::kDefault:
      for (int64_t i = 0; i < half; ++i)
        out[static_cast<size_t>(i)] = static_cast<float>(base[static_cast<size_t>(i)]);
      break;
    case RopeType::kLinear:
      for (int64_t i = 0; i < half; ++i)
        out[static_cast<size_t>(i)] = static_cast<float>(base[static_cast<size_t>(i)] / r.factor);
      break;
    case RopeType::kLlama3: {
      const double old_len = static_cast<double>(r.original_max_position_embeddings);
      const double low_wavelen = old_len / r.low_freq_factor;
      const double high_wavelen = old_len / r.high_freq_factor;
      for (int64_t i = 0; i < half; ++i) {
        const double f = base[static_cast<size_t>(i)];
        const double wavelen = 2.0 * std::numbers::pi / f;
        double v;
        if (wavelen > low_wavelen) {
          v = f / r.factor;
        } else if (wavelen < high_wavelen) {
          v = f;
        } else {
          const double smooth =
              (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
          v = (1.0 - smooth) * f / r.factor + smooth * f;
        }
        out[static_cast<size_t>(i)] = static_cast<float>(v);
      }
      break;
    }
    case RopeType::kYarn: {
      const double orig = static_cast<double>(r.original_max_position_embeddings);
      auto correction_dim = [&](double rotations) {
        return dim * std::log(orig / (rotations * 2.0 * std::numbers::pi)) /
               (2.0 * std::log(r.theta));
      };
      double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
      if (r.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, dim - 1.0);
      if (low == high) high += 0.001;  // as transformers: no singular ramp
      for (int64_t i = 0; i < half; ++i) {
        const double extra = base[static_cast<size_t>(i)], inter = extra / r.factor;
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extra_w = 1.0 - ramp;  // 1 - linear_ramp
        out[static_cast<size_t>(i)] = static_cast<float>(inter * (1.0 - extra_w) + extra * extra_w);
      }
      break;
    }
  }
  return out;
}

RopeTable::RopeTable(const RopeSpec& r)
    : inv_freq_(rope_inv_freq(r)), scale_(r.type == RopeType::kYarn ? r.attention_factor : 1.0) {}

void RopeTable::at(int64_t pos, float* cos, float* sin) const {
  const float p = static_cast<float>(pos);
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const float angle = inv_freq_[i] * p;  // fp32 product, as transformers
    cos[i] = static_cast<float>(std::cos(static_cast<double>(angle)) * scale_);
    sin[i] = static_cast<float>(std::sin(static_cast<double>(angle)) * scale_);
  }
}

void apply_rope(float* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * cos[i] - x2 * sin[i];
    x[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

}  // namespace exl3::model
