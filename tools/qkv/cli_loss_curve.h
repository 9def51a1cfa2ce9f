// The loss curve of `qkv train`: one point per step (the progress bar's 50-step means).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qkv::cli {

struct LossPoint {
  int64_t step = 0;
  double loss = 0, accuracy = 0;
};

// "step,loss,accuracy" then one line per point.
std::string loss_curve_csv(const std::vector<LossPoint>& points);
// A standalone SVG line chart of loss against step, with axis titles; `title` must be plain text
// without markup characters.
std::string loss_curve_svg(const std::vector<LossPoint>& points, const std::string& title);

}  // namespace qkv::cli
