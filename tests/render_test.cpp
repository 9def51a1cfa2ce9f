// The pictures of attention: escaping, the data a page embeds, the SVG (well-formed XML whose
// cells hold the weights), row-wise top-k against dense float64 weights, and refusals.
#include <cmath>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <utility>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/explain.h"
#include "qkv/render.h"
#include "test_util.h"

namespace qkv {
namespace {

const std::vector<std::string> kNastyTokens = {"<script>alert(1)</script>", "\"quoted\"",      "it's", "a&b",
                                               "</script><b>x</b>",         "\xE2\x80\xA8line"};

Matrix random_matrix(test::Rng& rng, int64_t rows, int64_t cols) {
  Matrix m(rows, cols);
  for (double& x : m.data) x = rng.uniform(-1.5, 1.5);
  return m;
}

// N tokens (cycling through kNastyTokens), E = 5, H heads sharing Hkv key/value heads, D = 3.
Explanation random_explanation(test::Rng& rng, int64_t n, int64_t heads, int64_t kv_heads) {
  std::vector<std::string> tokens;
  for (int64_t i = 0; i < n; ++i) tokens.push_back(kNastyTokens[static_cast<std::size_t>(i) % kNastyTokens.size()]);
  const int64_t E = 5, D = 3;
  Explanation e =
      explain_projections(tokens, random_matrix(rng, n, E), random_matrix(rng, E, heads * D),
                          random_matrix(rng, E, kv_heads * D), random_matrix(rng, E, kv_heads * 2), heads, kv_heads);
  e.title = "test <title> & \"more\"";
  return e;
}

// The JSON a page embeds for its script, parsed back.
nlohmann::json page_data(const std::string& page) {
  const std::string open = "<script type=\"application/json\" id=\"qkv-data\">";
  const std::size_t a = page.find(open);
  EXPECT_NE(a, std::string::npos);
  const std::size_t b = page.find("</script>", a);
  return nlohmann::json::parse(page.substr(a + open.size(), b - a - open.size()));
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (std::size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// A small XML well-formedness check: tags nest and match, attributes are quoted, '<' and '&'
// appear only as markup or entity starts. Returns "" or what is wrong.
std::string xml_problem(const std::string& x) {
  std::vector<std::string> open;
  std::size_t i = x.rfind("?>", 64) == std::string::npos ? 0 : x.find("?>") + 2;
  static const std::regex tag(R"re(^<(/?)([A-Za-z][\w:.-]*)((?:\s+[\w:.-]+="[^"<]*")*)\s*(/?)>)re");
  static const std::regex entity(R"re(^&(amp|lt|gt|quot|apos|#[0-9]+|#x[0-9a-fA-F]+);)re");
  while (i < x.size()) {
    if (x[i] == '<') {
      std::smatch m;
      const std::string rest = x.substr(i, 4096);
      if (!std::regex_search(rest, m, tag)) return "bad tag at " + rest.substr(0, 60);
      const std::string name = m[2];
      if (m[1] == "/") {
        if (open.empty() || open.back() != name) return "unmatched </" + name + ">";
        open.pop_back();
      } else if (m[4] != "/") {
        open.push_back(name);
      }
      i += static_cast<std::size_t>(m.length(0));
    } else if (x[i] == '&') {
      std::smatch m;
      const std::string rest = x.substr(i, 16);
      if (!std::regex_search(rest, m, entity)) return "bad entity at " + rest;
      i += static_cast<std::size_t>(m.length(0));
    } else {
      ++i;
    }
  }
  return open.empty() ? "" : "unclosed <" + open.back() + ">";
}

TEST(Render, HtmlEscapeLeavesNoMarkup) {
  EXPECT_EQ(html_escape("<script>alert(1)</script>"), "&lt;script&gt;alert(1)&lt;/script&gt;");
  EXPECT_EQ(html_escape("\"a\" & 'b'"), "&quot;a&quot; &amp; &#39;b&#39;");
  EXPECT_EQ(html_escape("caf\xC3\xA9"), "caf\xC3\xA9");
}

TEST(Render, JsonForScriptCannotEndTheScript) {
  const std::string text = "</script><script>alert(1)</script> & \xE2\x80\xA8 \xE2\x80\xA9 >";
  const std::string safe = json_for_script(nlohmann::json(text).dump());
  for (const char* bad : {"<", ">", "&", "\xE2\x80\xA8", "\xE2\x80\xA9"})
    EXPECT_EQ(safe.find(bad), std::string::npos) << bad;
  EXPECT_EQ(nlohmann::json::parse(safe).get<std::string>(), text);
}

TEST(Render, PageEscapesTokensAndEmbedsExactWeights) {
  test::Rng rng("Render.PageEscapesTokensAndEmbedsExactWeights");
  for (int64_t n : {1, 3, 7}) {
    const Explanation e = random_explanation(rng, n, 2, 1);
    const std::string page = render_explanation_html(e);
    // Two script elements (data and code), and no token text outside them unescaped.
    EXPECT_EQ(count(page, "<script"), 2) << n;
    EXPECT_EQ(page.find("<script>alert"), std::string::npos);
    EXPECT_EQ(page.find("<b>x</b>"), std::string::npos);
    EXPECT_NE(page.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
    EXPECT_NE(page.find("<h1>test &lt;title&gt; &amp; &quot;more&quot;</h1>"), std::string::npos);
    // Nothing to fetch: the only URL is the SVG namespace name, which is never loaded.
    EXPECT_EQ(count(page, "http:") + count(page, "https:"), count(page, "http://www.w3.org/2000/svg"))
        << "a page must not load anything";
    EXPECT_EQ(page.find(" src="), std::string::npos);
    const nlohmann::json d = page_data(page);
    EXPECT_EQ(d["kind"], "explain");
    EXPECT_EQ(d["tokens"].get<std::vector<std::string>>(), e.tokens);
    ASSERT_EQ(d["heads"].size(), 2u);
    for (std::size_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) {
          EXPECT_EQ(d["heads"][h]["weights"][i][j].get<double>(), e.heads[h].weights(i, j));
          EXPECT_EQ(d["heads"][h]["context"][i][0].get<double>(), e.heads[h].context(i, 0));
        }
  }
}

TEST(Render, ContextFirstPutsTheContextualVectorsBeforeTheSteps) {
  test::Rng rng("Render.ContextFirstPutsTheContextualVectorsBeforeTheSteps");
  const Explanation e = random_explanation(rng, 3, 1, 1);
  HtmlOptions o;
  o.context_first = true;
  const std::string first = render_explanation_html(e, o), last = render_explanation_html(e);
  EXPECT_LT(first.find("id=\"contextual\""), first.find("id=\"steps\""));
  EXPECT_GT(last.find("id=\"contextual\""), last.find("id=\"steps\""));
}

TEST(Render, PagesNameTheWordsSkippedAndWhereEveryValueIs) {
  test::Rng rng("Render.PagesNameTheWordsSkippedAndWhereEveryValueIs");
  const Explanation e = random_explanation(rng, 50, 1, 1);  // beyond 48 rows: tables show their corner
  HtmlOptions o;
  o.skipped_words = {"<x>", "y", "<x>"};
  o.steps_hint = "qkv explain --json";
  o.output_hint = "qkv context --format json";
  const std::string page = render_explanation_html(e, o);
  EXPECT_NE(page.find("--oov skip left 3 words out of the sentence, not being in the vocabulary: “&lt;x&gt;” ×2, "
                      "“y”."),
            std::string::npos);
  EXPECT_EQ(page.find("<x>"), std::string::npos);
  EXPECT_NE(page.find("(showing the first 48 rows × 5 columns; qkv explain --json has all)"), std::string::npos);
  EXPECT_NE(page.find("(showing the first 48 rows × 2 columns; qkv context --format json has all)"), std::string::npos);
  const std::string plain = render_explanation_html(e);
  EXPECT_EQ(plain.find("oov-note"), std::string::npos);
  EXPECT_NE(plain.find("; --json has all)"), std::string::npos);
  EXPECT_EQ(page_data(plain)["scale"], "absolute");
  o.color_scale = ColorScale::row;
  EXPECT_EQ(page_data(render_explanation_html(e, o))["scale"], "row");
  for (ColorScale c : {ColorScale::absolute, ColorScale::row}) EXPECT_EQ(parse_color_scale(color_scale_name(c)), c);
  EXPECT_EQ(parse_color_scale("Row"), std::nullopt);
}

TEST(Render, SvgIsWellFormedAndItsCellsAreTheWeights) {
  test::Rng rng("Render.SvgIsWellFormedAndItsCellsAreTheWeights");
  for (int64_t n : {1, 3, 13, 40}) {
    const Explanation e = random_explanation(rng, n, 3, 3);
    for (int64_t head : {-1, 0, 2}) {
      SvgOptions o;
      o.head = head;
      const std::string svg = render_heatmap_svg(e, o);
      EXPECT_EQ(xml_problem(svg), "") << "n=" << n << " head=" << head;
      EXPECT_EQ(svg.find("<script"), std::string::npos);
      static const std::regex cell(R"re(<rect class="cell"[^>]* data-i="(\d+)" data-j="(\d+)" data-w="([^"]+)")re");
      std::vector<int> seen(static_cast<std::size_t>(n * n * 3), 0);
      int cells = 0;
      // Every cell's data-w is the exact weight of the head its group belongs to.
      std::size_t pos = 0;
      for (int64_t g = (head < 0 ? 0 : head); g < (head < 0 ? 3 : head + 1); ++g) {
        const std::size_t start = svg.find("<g class=\"head\" data-head=\"" + std::to_string(g) + "\"", pos);
        ASSERT_NE(start, std::string::npos);
        const std::size_t end = svg.find("</g>", start);
        const std::string group = svg.substr(start, end - start);
        for (auto it = std::sregex_iterator(group.begin(), group.end(), cell); it != std::sregex_iterator(); ++it) {
          const int64_t i = std::stoll((*it)[1]), j = std::stoll((*it)[2]);
          EXPECT_EQ(std::strtod((*it)[3].str().c_str(), nullptr), e.heads[static_cast<std::size_t>(g)].weights(i, j));
          ++seen[static_cast<std::size_t>((g * n + i) * n + j)];
          ++cells;
        }
        pos = end;
      }
      EXPECT_EQ(cells, n * n * (head < 0 ? 3 : 1));
    }
  }
}

TEST(Render, SvgCleansInvalidUtf8AndControlCharacters) {
  test::Rng rng("Render.SvgCleansInvalidUtf8AndControlCharacters");
  Explanation e = random_explanation(rng, 3, 1, 1);
  e.tokens = {"bad\xFF", "tab\x01", "cut\xE2\x80"};
  const std::string svg = render_heatmap_svg(e);
  EXPECT_EQ(xml_problem(svg), "");
  // Bytes whose pattern looks right but which XML refuses: a surrogate, an overlong form, a code
  // point past U+10FFFF, U+FFFF (copied through by a check of the patterns alone).
  Explanation patterned = e;
  patterned.tokens = {"s\xED\xA0\x80", "o\xE0\x80\x80", "p\xF5\x80\x80\x80"};
  const std::string svg2 = render_heatmap_svg(patterned);
  EXPECT_EQ(xml_problem(svg2), "");
  EXPECT_EQ(svg2.find("\xED\xA0\x80"), std::string::npos);
  patterned.tokens = {"f\xEF\xBF\xBF", "a", "b"};
  EXPECT_EQ(render_heatmap_svg(patterned).find("\xEF\xBF\xBF"), std::string::npos);
  EXPECT_EQ(svg.find('\x01'), std::string::npos);
  EXPECT_EQ(svg.find("bad\xFF"), std::string::npos);
  EXPECT_NE(svg.find("bad\xEF\xBF\xBD"), std::string::npos);
}

TEST(Render, RefusesWhatItCannotDraw) {
  test::Rng rng("Render.RefusesWhatItCannotDraw");
  const Explanation e = random_explanation(rng, 3, 2, 2);
  SvgOptions o;
  o.head = 2;
  try {
    render_heatmap_svg(e, o);
    FAIL() << "head 3 of 2 drawn";
  } catch (const Error& err) {
    EXPECT_STREQ(err.what(), "svg: head 3 does not exist (the layer has 2 heads)");
  }
  Explanation big;
  big.tokens.assign(static_cast<std::size_t>(kMaxHeatmapTokens + 1), "w");
  try {
    render_explanation_html(big);
    FAIL() << "1025 tokens drawn as a heatmap";
  } catch (const Error& err) {
    EXPECT_STREQ(err.what(), "html: 1025 tokens is more than the 1024 a heatmap shows; use the top-k page");
  }
  EXPECT_THROW(render_heatmap_svg(big), Error);
  try {
    render_explanation_html(Explanation{});
    FAIL();
  } catch (const Error& err) {
    EXPECT_STREQ(err.what(), "html: nothing to show: no tokens");
  }
}

TEST(Render, RefusesExplanationsWhoseCountsDisagree) {
  // An Explanation is a struct a caller fills: counts that disagree were divided by (SIGFPE) or
  // indexed past (SIGSEGV) by the text, the page and the picture.
  test::Rng rng("Render.RefusesExplanationsWhoseCountsDisagree");
  const Explanation good = random_explanation(rng, 3, 4, 2);
  auto refused = [&](auto change, const std::string& why) {
    Explanation e = good;
    change(e);
    for (const auto& [render, what] : std::initializer_list<std::pair<std::function<void()>, std::string>>{
             {[&] { explanation_to_text(e); }, "explanation_to_text"},
             {[&] { render_explanation_html(e); }, "html"},
             {[&] { render_heatmap_svg(e); }, "svg"}})
      try {
        render();
        ADD_FAILURE() << what << " drew it: " << why;
      } catch (const Error& err) {
        EXPECT_EQ(std::string(err.what()), what + ": " + why);
      }
  };
  refused([](Explanation& e) { e.heads.resize(1); },
          "1 heads with num_heads = 4 and num_kv_heads = 2 (a positive "
          "divisor of it)");
  refused([](Explanation& e) { e.num_kv_heads = 0; },
          "4 heads with num_heads = 4 and num_kv_heads = 0 (a positive "
          "divisor of it)");
  refused([](Explanation& e) { e.tokens.pop_back(); }, "x is [3, 5] for 2 tokens");
  refused([](Explanation& e) { e.heads[1].k.data.pop_back(); }, "head 2: k is [3, 3] but holds 8 values");
}

// q [H, N, D], k [Hkv, M, D] as the float64 matrices explain_qkv takes (head h, key head hk).
Matrix head_matrix(const Tensor<float>& t, int64_t h) {
  Matrix m(t.dim(1), t.dim(2));
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t d = 0; d < m.cols; ++d) m(i, d) = t.cview()(h, i, d);
  return m;
}

TEST(Render, TopKMatchesDenseWeights) {
  test::Rng rng("Render.TopKMatchesDenseWeights");
  for (auto [H, Hkv, N, M, D, K] : std::vector<std::array<int64_t, 6>>{
           {1, 1, 1, 1, 1, 3}, {2, 1, 3, 3, 40, 2}, {4, 2, 37, 29, 3, 5}, {1, 1, 59, 59, 7, 59}}) {
    const Tensor<float> q = rng.normal32({H, N, D}), k = rng.normal32({Hkv, M, D});
    const TopKWeights t = attention_top_k(q.cview(), k.cview(), K);
    ASSERT_EQ(t.k, std::min(K, M));
    for (int64_t h = 0; h < H; ++h) {
      std::vector<std::string> names(static_cast<std::size_t>(M), "t");
      // The dense float64 oracle: explain_qkv of this head's q against its key head (v unused).
      const Matrix kh = head_matrix(k, h / (H / Hkv));
      Matrix qh = head_matrix(q, h);
      Matrix w(N, M);
      for (int64_t i = 0; i < N; ++i) {
        Matrix qi(M, D);  // explain_qkv wants square inputs; put query i in every row
        for (int64_t r = 0; r < M; ++r)
          for (int64_t d = 0; d < D; ++d) qi(r, d) = qh(i, d);
        const Explanation e = explain_qkv(names, qi, kh, kh);
        for (int64_t j = 0; j < M; ++j) w(i, j) = e.heads[0].weights(0, j);
        const std::vector<double> row = attention_row(q.cview(), k.cview(), h, i);
        // Weights come back rounded to float.
        for (int64_t j = 0; j < M; ++j) EXPECT_NEAR(row[static_cast<std::size_t>(j)], w(i, j), 1e-7 * w(i, j));
      }
      for (int64_t i = 0; i < N; ++i) {
        double kept = 0.0, previous = INFINITY;
        for (int64_t r = 0; r < t.k; ++r) {
          const std::size_t o = static_cast<std::size_t>((h * N + i) * t.k + r);
          const int64_t j = t.index[o];
          EXPECT_NEAR(t.weight[o], w(i, j), 1e-7 * w(i, j)) << "h=" << h << " i=" << i << " rank " << r;
          EXPECT_LE(t.weight[o], previous);
          previous = t.weight[o];
          kept += t.weight[o];
        }
        // Nothing outside the top k is larger than the k-th.
        int larger = 0;
        for (int64_t j = 0; j < M; ++j) larger += w(i, j) > previous * (1 + 1e-6);
        EXPECT_LE(larger, t.k - 1) << "h=" << h << " i=" << i;
        EXPECT_NEAR(t.rest[static_cast<std::size_t>(h * N + i)], std::max(0.0, 1.0 - kept), 1e-12);
        if (t.k == M) {
          EXPECT_NEAR(kept, 1.0, 1e-6);
        }
      }
    }
  }
}

TEST(Render, TopKWithTheFusedKernelsLseAgrees) {
  test::Rng rng("Render.TopKWithTheFusedKernelsLseAgrees");
  const int64_t H = 2, N = 45, D = 11;
  const Tensor<float> q = rng.normal32({1, H, N, D}), k = rng.normal32({1, H, N, D}), v = rng.normal32({1, H, N, D});
  Tensor<float> out({1, H, N, D}), lse({1, H, N});
  attention_forward(out.view(), lse.view(), q.cview(), k.cview(), v.cview());
  const std::array<int64_t, 3> s3{H, N, D};
  const std::array<int64_t, 2> s2{H, N};
  const TensorView<const float> q3(q.data(), s3), k3(k.data(), s3), lse2(lse.data(), s2);
  const TopKWeights own = attention_top_k(q3, k3, 6), fused = attention_top_k(q3, k3, 6, {}, lse2);
  for (std::size_t o = 0; o < own.weight.size(); ++o) {
    EXPECT_EQ(own.index[o], fused.index[o]);
    EXPECT_NEAR(fused.weight[o], own.weight[o], 1e-5 * own.weight[o] + 1e-9);
  }
}

TEST(Render, TopKRefusesBadArguments) {
  test::Rng rng("Render.TopKRefusesBadArguments");
  const Tensor<float> q = rng.normal32({2, 3, 4}), k = rng.normal32({1, 5, 4}), k3 = rng.normal32({3, 5, 4}),
                      bad = rng.normal32({1, 5, 3});
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([&] { attention_top_k(q.cview(), k.cview(), 0); }),
            "attention_top_k: top_k must be at least 1, got 0");
  EXPECT_EQ(message([&] { attention_top_k(q.cview(), bad.cview(), 2); }),
            "attention rows: q has D = 4 but k has D = 3");
  EXPECT_EQ(message([&] { attention_top_k(q.cview(), k3.cview(), 2); }),
            "attention rows: H = 2 query heads is not a positive multiple of Hkv = 3 key/value heads");
  EXPECT_EQ(message([&] { attention_row(q.cview(), k.cview(), 2, 0); }),
            "attention rows: head 2 row 0 is outside H = 2, N = 3");
  EXPECT_EQ(message([&] { attention_top_k(q.cview(), k.cview(), 2, {}, q.cview()); }),
            "top-k: lse must be [H, N] = [2, 3], got [2, 3, 4]");
  // Head 1 of a view without data: its address is not null, and was read.
  EXPECT_EQ(message([&] { attention_row(TensorView<const float>(nullptr, q.shape()), k.cview(), 1, 0); }),
            "attention rows: q: a null data pointer for shape [2, 3, 4]");
}

TEST(Render, TopKAndComparisonPagesEscapeAndCheckSizes) {
  test::Rng rng("Render.TopKAndComparisonPagesEscapeAndCheckSizes");
  const int64_t N = 9;
  const Tensor<float> q = rng.normal32({1, N, 3});
  LongInputPage p;
  p.title = "<script>alert(1)</script>";
  for (int64_t i = 0; i < N; ++i) p.tokens.push_back(kNastyTokens[static_cast<std::size_t>(i) % kNastyTokens.size()]);
  p.top = attention_top_k(q.cview(), q.cview(), 4);
  const std::string page = render_top_k_html(p);
  EXPECT_EQ(count(page, "<script"), 2);
  EXPECT_EQ(page.find("<script>alert"), std::string::npos);
  const nlohmann::json d = page_data(page);
  EXPECT_EQ(d["weight"].get<std::vector<double>>(), p.top.weight);
  EXPECT_EQ(d["tokens"].get<std::vector<std::string>>(), p.tokens);
  p.tokens.pop_back();
  EXPECT_THROW(render_top_k_html(p), Error);

  Comparison c;
  c.word = "<b>";
  c.first = {"a <b> c", {"a", "<b>", "c"}, 1, {{0.2, 0.5, 0.3}}, {1, 2}, {3, 4}, {}};
  c.second = {"<b> d", {"<b>", "d"}, 0, {{0.6, 0.4}}, {1, 2}, {5, 6}, {}};
  const std::string cmp = render_comparison_html(c);
  EXPECT_EQ(cmp.find("<b>"), std::string::npos);
  EXPECT_EQ(page_data(cmp)["sentences"][1]["weights"][0][1].get<double>(), 0.4);
  c.second.position = 2;
  try {
    render_comparison_html(c);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "html: second sentence: word position 2 outside 2 tokens");
  }
}

}  // namespace
}  // namespace qkv
