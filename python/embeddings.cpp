// qkv.load_embeddings, qkv.Embeddings and qkv.tokenize: static word vectors for numpy. The matrix
// is handed to numpy without a copy (a read-only view kept alive by the Embeddings object), so a
// large GloVe file costs its size once.
#include <fmt/format.h>
#include <pybind11/stl.h>

#include <fstream>
#include <memory>
#include <string_view>

#include "bare_new.h"
#include "bind_util.h"
#include "bindings.h"
#include "qkv/embeddings.h"
#include "qkv/error.h"
#include "qkv/utf8.h"

namespace qkvpy {
namespace {

using qkv::Embeddings;

qkv::EmbeddingFormat parse_format(const std::string& name) {
  if (name == "auto") return qkv::EmbeddingFormat::automatic;
  if (name == "glove") return qkv::EmbeddingFormat::glove;
  if (name == "word2vec_text") return qkv::EmbeddingFormat::word2vec_text;
  if (name == "word2vec_binary") return qkv::EmbeddingFormat::word2vec_binary;
  throw py::value_error(
      fmt::format("format must be 'auto', 'glove', 'word2vec_text' or 'word2vec_binary', got '{}'", name));
}

qkv::OovPolicy parse_oov(const std::string& name) {
  if (name == "error") return qkv::OovPolicy::error;
  if (name == "zero") return qkv::OovPolicy::zero;
  if (name == "skip") return qkv::OovPolicy::skip;
  throw py::value_error(fmt::format("oov must be 'error', 'zero' or 'skip', got '{}'", name));
}

// The 1-based line of a text embeddings file whose row starts with `word`, or 0 (binary files).
int64_t line_of_word(const std::string& path, const std::string& word) {
  std::ifstream in(path, std::ios::binary);
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n)
    if (line.size() > word.size() && line.compare(0, word.size(), word) == 0 &&
        (line[word.size()] == ' ' || line[word.size()] == '\t'))
      return n;
  return 0;
}

// `w` quoted for a message: printable ASCII as is, every other byte as \xNN, cut at 40 bytes.
std::string escaped(const std::string& w) {
  std::string out = "'";
  for (std::size_t i = 0; i < w.size() && i < 40; ++i) {
    const auto c = static_cast<unsigned char>(w[i]);
    out += c >= 0x20 && c < 0x7f && c != '\\' ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
  }
  return out + (w.size() > 40 ? "...'" : "'");
}

// unicode_errors, as gensim's loaders take it: "strict", "replace" or "ignore".
qkv::InvalidUtf8 parse_unicode_errors(const std::string& name) {
  if (name == "strict") return qkv::InvalidUtf8::keep;  // then refused by check_words_are_utf8
  if (name == "replace") return qkv::InvalidUtf8::replace;
  if (name == "ignore") return qkv::InvalidUtf8::ignore;
  throw py::value_error(fmt::format("unicode_errors must be 'strict', 'replace' or 'ignore', got '{}'", name));
}

// Python words are str: with unicode_errors="strict" a word that is not UTF-8 is refused when
// loading, naming the file and line, rather than as a bare UnicodeDecodeError from .words later.
void check_words_are_utf8(const Embeddings& e, const std::string& path) {
  for (int64_t i = 0; i < e.size(); ++i) {
    const std::string& w = e.word(i);
    const std::size_t bad = qkv::invalid_utf8_at(w);
    if (bad == std::string_view::npos) continue;
    const int64_t line = line_of_word(path, w);
    const std::string where = line > 0 ? fmt::format("word {} (line {})", i + 1, line) : fmt::format("word {}", i + 1);
    throw qkv::Error(
        fmt::format("{}: {}: the word {} is not valid UTF-8 (byte {} is 0x{:02x}); Python words are str: "
                    "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8), or pass unicode_errors='replace' "
                    "(U+FFFD for each bad sequence) or 'ignore' (drop it)",
                    path, where, escaped(w), bad + 1, static_cast<unsigned char>(w[bad])));
  }
}

std::shared_ptr<Embeddings> load(const std::string& path, const std::string& format,
                                 const std::string& unicode_errors) {
  const qkv::EmbeddingFormat f = parse_format(format);
  const qkv::InvalidUtf8 invalid = parse_unicode_errors(unicode_errors);
  InterruptibleRelease release;  // Ctrl-C stops the load between blocks of the file
  auto e = std::make_shared<Embeddings>(Embeddings::load(path, f, invalid));
  check_words_are_utf8(*e, path);
  return e;
}

// The matrix [V, E] as a read-only float32 view whose base keeps the Embeddings alive.
py::array matrix_view(const py::object& self) {
  const qkv::Tensor<float>& m = self.cast<const Embeddings&>().matrix();
  std::vector<py::ssize_t> dims(m.shape().begin(), m.shape().end());
  py::array_t<float> view(dims, m.data(), self);
  view.attr("setflags")(py::arg("write") = false);
  return view;
}

std::vector<std::string> words_of(const Embeddings& e) {
  std::vector<std::string> words;
  words.reserve(static_cast<std::size_t>(e.size()));
  for (int64_t i = 0; i < e.size(); ++i) words.push_back(e.word(i));
  return words;
}

py::tuple embed(const Embeddings& e, const py::object& sentence, const py::object& oov) {
  qkv::EmbeddedSentence s = qkv::embed_sentence(e, string_arg(sentence, "sentence"), parse_oov(string_arg(oov, "oov")));
  return py::make_tuple(s.tokens, tensor_to_numpy(std::move(s.x)), s.missing);
}

constexpr const char* kEmbeddingsDoc = R"(A vocabulary of words and their static vectors, matrix [V, E].

Embeddings.load(path, format="auto", unicode_errors="strict") reads GloVe text, word2vec text
or word2vec binary ("auto" tells them apart by content). unicode_errors, as in gensim, says what
a word that is not valid UTF-8 becomes: "strict" refuses the file (ValueError naming the line and
word), "replace" puts U+FFFD for each invalid sequence and "ignore" drops those bytes, as
bytes.decode("utf-8", errors=...) does (duplicates this makes keep the first for find()). A file
that cannot be opened raises OSError as open() does (FileNotFoundError, PermissionError,
IsADirectoryError); ValueError names the file and line for a ragged or non-numeric row, a
truncated binary file or an empty vocabulary.
Embeddings(words, matrix) builds one from a list of V words and a float32 array [V, E].
Immutable; safe to share between threads.)";

}  // namespace

void bind_embeddings(py::module_& m) {
  py::class_<Embeddings, std::shared_ptr<Embeddings>> cls(m, "Embeddings", kEmbeddingsDoc);
  refuse_bare_new(cls);
  cls.def(py::init([](const py::object& words_obj, const py::object& matrix) {
            if (!is_list_arg(words_obj))
              throw py::type_error(
                  fmt::format("words must be a list of strings, got {}", std::string(py::repr(words_obj))));
            std::vector<std::string> words;
            for (const py::handle w : words_obj) words.push_back(string_arg(w, fmt::format("words[{}]", words.size())));
            py::array owner;
            const qkv::TensorView<const float> v = float32_view(matrix, "matrix", owner);
            if (v.rank() != 2 || v.dim(0) != static_cast<int64_t>(words.size()))
              throw py::value_error(fmt::format("matrix: shape {} must be [V, E] with V = {} words",
                                                qkv::shape_string(v.shape()), words.size()));
            return std::make_shared<Embeddings>(std::move(words), qkv::to_contiguous<float>(v));
          }),
          py::arg("words"), py::arg("matrix"), "Builds embeddings from words and a [V, E] matrix (copied).");
  cls.def_static(
      "load",
      [](const py::object& path, const py::object& format, const py::object& unicode_errors) {
        return load(path_arg(path, "path"), string_arg(format, "format"), string_arg(unicode_errors, "unicode_errors"));
      },
      py::arg("path"), py::arg("format") = "auto", py::arg("unicode_errors") = "strict",
      "Loads GloVe / word2vec text / word2vec binary embeddings (see the class docstring).");
  cls.def_property_readonly("matrix", &matrix_view, "The vectors [V, E] as a read-only float32 view (no copy).");
  cls.def_property_readonly("words", &words_of, "The vocabulary as a list of V words, in file order.");
  cls.def_property_readonly(
      "dim", [](const Embeddings& e) { return e.dim(); }, "E, the width of each vector.");
  cls.def(
      "__len__", [](const Embeddings& e) { return e.size(); }, "V, the number of words.");
  cls.def(
      "find", [](const Embeddings& e, const py::object& w) { return e.find(string_arg(w, "word")); }, py::arg("word"),
      "Index of `word` (exact, else lowercased, else ignoring ASCII case), or -1 if absent.");
  cls.def(
      "__contains__",
      [](const Embeddings& e, const py::object& w) {
        return py::isinstance<py::str>(w) && e.find(string_arg(w, "word")) >= 0;  // `1 in e` is False, as for a list
      },
      py::arg("word"), "True if find(word) finds it.");
  cls.def(
      "vector",
      [](const py::object& self, const py::object& word) -> py::object {
        const std::string w = string_arg(word, "word");
        const int64_t i = self.cast<const Embeddings&>().find(w);
        if (i < 0) throw py::key_error(fmt::format("'{}' is not in the vocabulary", w));
        return matrix_view(self)[py::int_(i)];
      },
      py::arg("word"), "The vector of `word` (read-only view); KeyError if it is not in the vocabulary.");
  cls.def("embed", &embed, py::arg("sentence"), py::arg("oov") = "error",
          R"(Tokenizes `sentence` (qkv.tokenize) and looks the tokens up.

Returns (tokens, x, missing): the tokens kept, x float32 [N, E], and the out-of-vocabulary tokens.
oov: "error" raises ValueError listing every missing word; "zero" gives them a zero row; "skip"
drops them. ValueError if the sentence has no tokens or none remain.)");
  cls.def("__repr__", [](const Embeddings& e) { return fmt::format("Embeddings(V={}, E={})", e.size(), e.dim()); });

  m.def(
      "load_embeddings",
      [](const py::object& path, const py::object& format, const py::object& unicode_errors) {
        const std::shared_ptr<Embeddings> e =
            load(path_arg(path, "path"), string_arg(format, "format"), string_arg(unicode_errors, "unicode_errors"));
        return py::make_tuple(words_of(*e), matrix_view(py::cast(e)));
      },
      py::arg("path"), py::arg("format") = "auto", py::arg("unicode_errors") = "strict",
      R"(Loads word embeddings; returns (words, matrix): a list of V words and a read-only float32
array [V, E] (no copy of the vectors). format: "auto", "glove", "word2vec_text" or
"word2vec_binary". unicode_errors: "strict", "replace" or "ignore" for words that are not valid
UTF-8 (see qkv.Embeddings). Raises OSError as open() does for a file that cannot be opened
(FileNotFoundError for a missing one), ValueError naming the file (and line) for anything malformed.
Use qkv.Embeddings.load for lookups and sentence embedding.)");
  m.def(
      "tokenize", [](const py::object& sentence) { return qkv::tokenize(string_arg(sentence, "sentence")); },
      py::arg("sentence"),
      "Lowercases and splits on whitespace and ASCII punctuation (dropped); bytes >= 0x80 stay inside words. "
      "\"The bank's\" -> ['the', 'bank', 's'].");
}

}  // namespace qkvpy
