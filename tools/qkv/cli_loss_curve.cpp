// The loss curve of `qkv train` as CSV and as a standalone SVG line chart.
#include "cli_loss_curve.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace qkv::cli {

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
  for (int i = 0; i <= 4; ++i) {  // horizontal grid lines with loss labels
    const double loss = lo + (hi - lo) * i / 4.0, y = py(loss);
    svg += fmt::format(
        "<line x1=\"{}\" y1=\"{:.1f}\" x2=\"{}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
        "<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{:.2f}</text>\n",
        kLeft, y, kW - kRight, y, kLeft - 6, y + 4, loss);
  }
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
