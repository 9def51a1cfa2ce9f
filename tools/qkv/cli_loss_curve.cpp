// The loss curve of `qkv train` as CSV and as a standalone SVG line chart.
#include "cli_loss_curve.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

namespace qkv::cli {
namespace {

// Round values covering [lo, hi] for an axis: a step of 1, 2 or 5 × 10^k giving at most `most`
// intervals (what a reader can add up in their head).
std::vector<double> ticks(double lo, double hi, int most) {
  const double raw = (hi - lo) / most, magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * magnitude;
  for (double m : {1.0, 2.0, 5.0})
    if (m * magnitude >= raw * (1 - 1e-9)) {
      step = m * magnitude;
      break;
    }
  std::vector<double> out;
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; ++k)
    out.push_back(k * step + 0.0);  // + 0.0: no "-0"
  return out;
}

}  // namespace

std::string loss_curve_csv(const std::vector<LossPoint>& points) {
  std::string out = "step,loss,accuracy\n";
  for (const LossPoint& p : points) out += fmt::format("{},{:.6f},{:.6f}\n", p.step, p.loss, p.accuracy);
  return out;
}

std::string loss_curve_svg(const std::vector<LossPoint>& points, const std::string& title) {
  constexpr double kW = 640, kH = 360, kLeft = 64, kRight = 16, kTop = 36, kBottom = 48;
  double lo = 0, hi = 1;
  int64_t last = 1;
  if (!points.empty()) {
    const auto [mn, mx] = std::minmax_element(points.begin(), points.end(),
                                              [](const LossPoint& a, const LossPoint& b) { return a.loss < b.loss; });
    lo = std::floor(mn->loss);
    hi = std::max(std::ceil(mx->loss), lo + 1);
    last = std::max<int64_t>(points.back().step, 1);
  }
  const auto px = [&](double step) { return kLeft + (kW - kLeft - kRight) * step / static_cast<double>(last); };
  const auto py = [&](double loss) { return kTop + (kH - kTop - kBottom) * (hi - loss) / (hi - lo); };
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"20\" font-size=\"14\">{3}</text>\n",
      kW, kH, kLeft, title);
  for (double loss : ticks(lo, hi, 5)) {  // horizontal grid lines with the loss at each
    const double y = py(loss);
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
        "<text class=\"tick y\" x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:g}</text>\n",
        kLeft, y, kW - kRight, y, kLeft - 6, y + 4, loss);
  }
  for (double step : ticks(0, static_cast<double>(last), 6)) {  // tick marks with the step at each
    const double x = px(step);
    svg += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"#444\"/>"
        "<text class=\"tick x\" x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{:g}</text>\n",
        x, kH - kBottom, x, kH - kBottom + 5, x, kH - kBottom + 18, step);
  }
  svg += fmt::format("<path class=\"axes\" fill=\"none\" stroke=\"#444\" d=\"M{0} {1}V{2}H{3}\"/>\n", kLeft, kTop,
                     kH - kBottom, kW - kRight);
  svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">training step (of {})</text>\n",
                     (kLeft + kW - kRight) / 2, kH - 12, last);
  svg += fmt::format(
      "<text transform=\"translate(16 {:.1f}) rotate(-90)\" text-anchor=\"middle\">"
      "cross-entropy loss (mean of the last 50 steps)</text>\n",
      (kTop + kH - kBottom) / 2);
  svg += "<polyline fill=\"none\" stroke=\"#c0392b\" stroke-width=\"1.5\" points=\"";
  for (const LossPoint& p : points) svg += fmt::format("{:.1f},{:.1f} ", px(static_cast<double>(p.step)), py(p.loss));
  svg += "\"/>\n</svg>\n";
  return svg;
}

}  // namespace qkv::cli
